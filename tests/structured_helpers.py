"""A tiny random Llama with the embedded model's vocabulary (so it runs under SmolLM2's real
BPE tokenizer: grammars compile against it, servers load it) and a run-to-the-end loop; used by
the structured-output and control end-to-end tests."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from nitsum.config import ModelConfig
from nitsum.engine.build import build_engine
from nitsum.engine.engine import Engine
from nitsum.engine.engine_config import EngineConfig
from tiny import run_to_completion

# SmolLM2's vocabulary and EOS (<|im_end|>).
VOCAB, EOS = 49152, 2


def tiny_llama(vocab: int = VOCAB, seed: int = 0) -> LlamaForCausalLM:
    """A random 2-layer Llama with the given vocabulary (fp32, eval)."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=EOS,
    )
    return LlamaForCausalLM(cfg).eval()


def tiny_engine(hf: LlamaForCausalLM, **kw: object) -> Engine:
    """A TP-1 CPU engine on `hf`'s weights."""
    cfg = ModelConfig.from_hf(hf.config.to_dict() | {"architectures": ["LlamaForCausalLM"]})
    ecfg = EngineConfig(**({"kv_cache_bytes": 16 << 20} | kw))  # type: ignore[arg-type]
    return build_engine(cfg, hf.state_dict().items(), ecfg, (EOS,))


def run(engine: Engine) -> tuple[dict[str, list[int]], dict[str, str]]:
    """Step until every request finished (within 5000 steps): token ids and finish reasons."""
    return run_to_completion(engine, max_steps=5000)


def tokenizer_json(smollm2_dir: Path) -> str:
    return (smollm2_dir / "tokenizer.json").read_text(encoding="utf-8")
