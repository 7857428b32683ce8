"""Load a Llama-family GGUF file as HF-named float32 tensors plus an HF config and tokenizer.

llama.cpp's converter renames tensors (``blk.0.attn_q.weight``), quantizes them, and (for the
``llama`` architecture only) permutes the rows of the q/k projections so that its rotary kernel
can rotate adjacent pairs; HF's Llama rotates the two halves of each head instead. We dequantize
with the ``gguf`` package and undo both, so the result is exactly what the HF checkpoint would hold
(up to the quantization error of the file). ``qwen2`` GGUFs use HF's rotation and are not permuted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from gguf.quants import dequantize

from nitsum.weights.gguf_tokenizer import build_tokenizer_json

# GGUF architecture -> (HF architecture, HF model_type, q/k rows permuted by llama.cpp)
_ARCHITECTURES = {
    "llama": ("LlamaForCausalLM", "llama", True),
    "qwen2": ("Qwen2ForCausalLM", "qwen2", False),
}
SUPPORTED_ARCHITECTURES = tuple(_ARCHITECTURES)

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


@dataclass
class GGUFModel:
    """A GGUF file converted to what an HF model directory would contain."""

    config: dict
    """An HF ``config.json`` dict (``LlamaForCausalLM`` or ``Qwen2ForCausalLM``)."""
    tensors: dict[str, torch.Tensor]
    """HF names -> float32 tensors in HF layout. No ``lm_head.weight`` when embeddings are tied."""
    tokenizer_json: str
    """An HF ``tokenizers`` ``tokenizer.json`` rebuilt from the GGUF metadata."""
    chat_template: str | None
    """``tokenizer.chat_template`` from the GGUF metadata, if any."""
    generation_config: dict
    """An HF ``generation_config.json`` dict (bos/eos/pad ids)."""
    special_tokens: dict[str, str] = field(default_factory=dict)
    """``bos_token``/``eos_token``/``unk_token``/``pad_token`` -> token text (those named)."""


def hf_tensor_name(gguf_name: str) -> str:
    """Map a llama.cpp tensor name to its HF Llama name.

    Raises:
        ValueError: a tensor we do not know how to place (e.g. MoE experts, ``rope_freqs``).
    """
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _BLOCK_RE.fullmatch(gguf_name)
    if m and m.group(2) in _BLOCK_NAMES:
        return f"model.layers.{m.group(1)}.{_BLOCK_NAMES[m.group(2)]}.{m.group(3)}"
    raise ValueError(f"unsupported GGUF tensor {gguf_name!r} for a Llama-family model")


def unpermute_qk(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation (``convert_hf_to_gguf.py``'s ``permute``).

    Per head, llama.cpp stores rows as (pairs, 2) interleaved; HF stores (2, half) halves.
    ``n_head`` is the number of heads of *this* projection (KV heads for k).
    """
    rows = w.shape[0]
    return (
        w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:])
        .transpose(1, 2)
        .reshape(w.shape)
        .contiguous()
    )


def read_metadata(reader: gguf.GGUFReader) -> dict[str, Any]:
    """All key/value metadata of a GGUF as plain Python values (lists for arrays)."""
    return {key: field.contents() for key, field in reader.fields.items()}


def _open(path: Path) -> gguf.GGUFReader:
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {path}")
    try:
        return gguf.GGUFReader(path)
    except ValueError as e:  # the reader's error for a bad magic / version
        raise ValueError(f"{path} is not a readable GGUF file: {e}") from e


def _hf_config(meta: dict[str, Any], tensors: dict[str, Any]) -> dict[str, Any]:
    """The HF ``config.json`` dict equivalent to the GGUF metadata and tensor list."""
    arch = meta["general.architecture"]

    def key(name: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{name}", default)
        if value is None:
            raise ValueError(f"GGUF metadata lacks {arch}.{name}")
        return value

    hidden, n_head = int(key("embedding_length")), int(key("attention.head_count"))
    n_kv = int(key("attention.head_count_kv", n_head))
    head_dim = int(meta.get(f"{arch}.attention.key_length", hidden // n_head))
    rope_dim = int(meta.get(f"{arch}.rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise ValueError(f"partial rotary embeddings ({rope_dim} of {head_dim}) are not supported")
    if "rope_freqs.weight" in tensors:
        raise ValueError("per-frequency rope scaling (rope_freqs tensor) is not supported")
    rope_scaling = None
    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling == "linear":
        rope_scaling = {"rope_type": "linear", "factor": float(key("rope.scaling.factor"))}
    elif scaling != "none":
        raise ValueError(f"rope scaling {scaling!r} is not supported")
    hf_arch, model_type, _ = _ARCHITECTURES[arch]
    config = {
        "architectures": [hf_arch],
        "model_type": model_type,
        "hidden_size": hidden,
        "intermediate_size": int(key("feed_forward_length")),
        "num_hidden_layers": int(key("block_count")),
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
        "rope_scaling": rope_scaling,
        "max_position_embeddings": int(key("context_length")),
        "vocab_size": int(tensors["token_embd.weight"].shape[-1]),
        # NOTE: tied (SmolLM2): the LM head reuses the embedding; the file has no output.weight.
        "tie_word_embeddings": "output.weight" not in tensors,
        "attention_bias": "blk.0.attn_q.bias" in tensors,
        "mlp_bias": False,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
        "torch_dtype": "float32",
        "initializer_range": 0.02,
        "use_cache": True,
    }
    if model_type == "qwen2":
        # NOTE: HF Qwen2 always has q/k/v biases and no attention_bias / mlp_bias keys.
        del config["attention_bias"], config["mlp_bias"]
        config.update(use_sliding_window=False, sliding_window=None)
    return config


def _generation_config(meta: dict[str, Any]) -> dict[str, Any]:
    # NOTE: chat models stop at end-of-turn tokens that llama.cpp stores apart from EOS.
    eos = [
        meta[k]
        for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id")
        if meta.get(k) is not None
    ]
    eos = list(dict.fromkeys(eos))
    gen: dict[str, Any] = {"bos_token_id": meta.get("tokenizer.ggml.bos_token_id")}
    gen["eos_token_id"] = eos[0] if len(eos) == 1 else (eos or None)
    if meta.get("tokenizer.ggml.padding_token_id") is not None:
        gen["pad_token_id"] = meta["tokenizer.ggml.padding_token_id"]
    return gen


def _special_tokens(meta: dict[str, Any]) -> dict[str, str]:
    tokens = meta["tokenizer.ggml.tokens"]
    ids = {
        "bos_token": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token": meta.get("tokenizer.ggml.eos_token_id"),
        "unk_token": meta.get("tokenizer.ggml.unknown_token_id"),
        "pad_token": meta.get("tokenizer.ggml.padding_token_id"),
    }
    return {name: tokens[i] for name, i in ids.items() if i is not None and 0 <= i < len(tokens)}


def load_gguf(path: str | Path) -> GGUFModel:
    """Read a ``llama`` or ``qwen2`` GGUF into HF config, float32 HF tensors and tokenizer.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: not a GGUF, or an architecture / tensor / tokenizer we do not support.
    """
    path = Path(path)
    reader = _open(path)
    meta = read_metadata(reader)
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"{path.name}: GGUF architecture {arch!r} is not supported "
            f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    names = {t.name: t for t in reader.tensors}
    config = _hf_config(meta, names)
    permuted = _ARCHITECTURES[arch][2]

    tensors: dict[str, torch.Tensor] = {}
    for gname, t in names.items():
        hf_name = hf_tensor_name(gname)
        # NOTE: GGUF shapes are (ne0, ne1, ...) = innermost first; HF wants the reverse.
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        arr = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
        w = torch.from_numpy(arr.copy())  # copy: the reader's data is a read-only memmap
        if not permuted:
            pass
        elif ".attn_q." in gname:
            w = unpermute_qk(w, config["num_attention_heads"])
        elif ".attn_k." in gname:
            w = unpermute_qk(w, config["num_key_value_heads"])
        tensors[hf_name] = w
    return GGUFModel(
        config=config,
        tensors=tensors,
        tokenizer_json=build_tokenizer_json(meta),
        chat_template=meta.get("tokenizer.chat_template"),
        generation_config=_generation_config(meta),
        special_tokens=_special_tokens(meta),
    )
