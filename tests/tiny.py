"""Tiny random HF models used as references across tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from nitsum.config import ModelConfig
from nitsum.engine.build import EngineConfig
from nitsum.pool.device_pool import DevicePool
from nitsum.pool.device_proc import ModelSource

BASE = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=4,
    max_position_embeddings=256,
)

VARIANTS = {
    "llama-gqa": lambda: LlamaForCausalLM(LlamaConfig(**BASE)),
    "llama-tied": lambda: LlamaForCausalLM(LlamaConfig(**BASE, tie_word_embeddings=True)),
    "llama3-rope": lambda: LlamaForCausalLM(
        LlamaConfig(
            **BASE,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        )
    ),
    "qwen2-bias": lambda: Qwen2ForCausalLM(Qwen2Config(**BASE)),
    "mha": lambda: LlamaForCausalLM(LlamaConfig(**{**BASE, "num_key_value_heads": 8})),
    # room for an 8k-token prompt (the long-prompt fairness test)
    "llama-long": lambda: LlamaForCausalLM(
        LlamaConfig(**{**BASE, "max_position_embeddings": 8448})
    ),
}


def make_tiny(variant: str = "llama-gqa", seed: int = 0):
    """A random HF model (fp32, eval) and our ModelConfig for it."""
    torch.manual_seed(seed)
    model = VARIANTS[variant]().eval()
    # Random init leaves biases at zero; make them matter.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    cfg = ModelConfig.from_hf(model.config.to_dict() | {"architectures": [type(model).__name__]})
    return model, cfg


# A 4-device CPU pool of the "llama-gqa" tiny model (4 KV heads: TP 1/2/4), shared by the TP
# switching and host worker tests.
POOL_DEVICES = 4
POOL_ECFG = EngineConfig(page_tokens=4, token_budget=64, tp_levels=(1, 2, 4))
POOL_PAGES = 256


@contextmanager
def tiny_device_pool(tiny: tuple) -> Iterator[DevicePool]:
    """Device processes for `tiny = make_tiny(...)`, stopped on exit."""
    hf, cfg = tiny
    source = ModelSource(hf_config=cfg.extra, state_dict=hf.state_dict())
    with DevicePool(POOL_DEVICES, source, POOL_ECFG, POOL_PAGES, levels=(1, 2, 4)) as pool:
        yield pool
