"""HF directory loading against tiny random models saved by transformers itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from nitsum.weights.hf import iter_hf_tensors, load_hf_config

TINY = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)


def _save_tiny(kind: str, out: Path, tied: bool, **save_kwargs: object) -> dict[str, torch.Tensor]:
    import transformers

    config_cls = getattr(transformers, f"{kind}Config")
    model_cls = getattr(transformers, f"{kind}ForCausalLM")
    torch.manual_seed(0)
    model = model_cls(config_cls(**TINY, tie_word_embeddings=tied))
    model.save_pretrained(out, **save_kwargs)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("kind", ["Llama", "Qwen2", "Mistral"])
def test_iter_hf_tensors_equals_state_dict(kind: str, tmp_path: Path) -> None:
    state = _save_tiny(kind, tmp_path, tied=False)
    got = dict(iter_hf_tensors(tmp_path))
    assert sorted(got) == sorted(state)
    assert "model.layers.1.self_attn.q_proj.weight" in got and "lm_head.weight" in got
    for name, want in state.items():
        assert torch.equal(got[name], want), name
    config = load_hf_config(tmp_path)
    assert config["architectures"] == [f"{kind}ForCausalLM"]
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (4, 2)


def test_sharded_and_tied(tmp_path: Path) -> None:
    state = _save_tiny("Llama", tmp_path, tied=True, max_shard_size="20KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1  # really sharded
    (tmp_path / "stray.safetensors").write_bytes(b"not listed in the index")  # must be ignored
    got = dict(iter_hf_tensors(tmp_path))
    # NOTE: a tied LM head is not saved; the loader must not invent it.
    assert sorted(got) == sorted(k for k in state if k != "lm_head.weight")
    for name, want in got.items():
        assert torch.equal(want, state[name]), name
    assert load_hf_config(tmp_path)["tie_word_embeddings"] is True


def test_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_hf_config(tmp_path)
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        list(iter_hf_tensors(tmp_path))
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="only safetensors"):
        list(iter_hf_tensors(tmp_path))
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a.weight": "model-00001-of-00002.safetensors"}})
    )
    with pytest.raises(FileNotFoundError, match="shards that do not exist"):
        list(iter_hf_tensors(tmp_path))
