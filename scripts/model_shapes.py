"""Model shapes the GPU benchmarks share, and a random HF Llama of one made on the device.

from model_shapes import SHAPES, random_llama  # scripts/ is on the path
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM

# HF config fields of each shape: "8b" is Llama-3-8B's; "tiny" proves a script runs on CPU.
SHAPES: dict[str, dict[str, Any]] = {
    "8b": dict(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
        max_position_embeddings=8192,
        rope_theta=500000.0,
    ),
    "tiny": dict(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        vocab_size=1024,
        max_position_embeddings=2048,
    ),
}


def random_llama(
    shape: str, device: str, dtype: torch.dtype, **overrides: Any
) -> tuple[LlamaForCausalLM, LlamaConfig]:
    """A random-weight HF Llama of `shape` (fields in `overrides` replace the shape's), made
    on `device` in `dtype` directly (NOTE: no fp32 copy of 8B weights), seeded, in eval mode."""
    torch.manual_seed(0)
    hf_cfg = LlamaConfig(**(SHAPES[shape] | overrides))
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            hf = LlamaForCausalLM(hf_cfg).eval()
    finally:
        torch.set_default_dtype(default)
    return hf, hf_cfg
