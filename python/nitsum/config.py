"""Model configuration read from an HF `config.json` dict."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")


# The TP levels an engine or a pool considers unless told otherwise; a model keeps those its
# heads and MLP allow (`ModelConfig.allowed_tp_levels`), a pool those it can hold
# (`parallel.topology.TPTopology`). 3 is for models with 3 or 9 KV heads (SmolLM2).
DEFAULT_TP_LEVELS: tuple[int, ...] = (1, 2, 3, 4, 8)
# Host KV tier per device of `nitsum serve` and `python -m nitsum.worker` (MiB), for the KV of
# swapped-out sequences (kv/host_tier.py).
HOST_KV_CACHE_MB = 256
# `--dtype` choices of `nitsum serve` and the worker (torch dtype names).
DTYPES = ("float32", "bfloat16", "float16")
# How a worker decides the bindings a tier or the load trigger asks for
# (`EngineConfig.bind_policy`): weighed by the cost model, or always.
BIND_POLICIES = ("cost", "always")


def mebibytes(text: str) -> int:
    """An argparse type for a size in MiB: an integer ≥ 0 (a negative one is refused, not
    read as 0)."""
    value = int(text)
    if value < 0:
        raise ValueError(f"must be >= 0 MiB, got {value}")
    return value


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a Llama-family decoder. Nothing here depends on the TP degree."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    rope_scaling: dict[str, Any] | None = None
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> ModelConfig:
        """Build from an HF config dict; raises ValueError for unsupported architectures."""
        archs = cfg.get("architectures") or ["LlamaForCausalLM"]
        arch = archs[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            supported = ", ".join(SUPPORTED_ARCHITECTURES)
            raise ValueError(f"unsupported architecture {arch!r}; supported: {supported}")
        num_heads = cfg["num_attention_heads"]
        hidden = cfg["hidden_size"]
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        # Qwen2 always has q/k/v bias; Llama/Mistral only when `attention_bias` says so.
        bias = arch == "Qwen2ForCausalLM" or bool(cfg.get("attention_bias", False))
        # transformers >= 5 writes `rope_parameters`; older configs `rope_theta` + `rope_scaling`.
        rope = cfg.get("rope_parameters") or {}
        scaling = cfg.get("rope_scaling") or (
            rope if rope.get("rope_type", "default") != "default" else None
        )
        return cls(
            architecture=arch,
            vocab_size=cfg["vocab_size"],
            hidden_size=hidden,
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=cfg.get("num_key_value_heads") or num_heads,
            head_dim=cfg.get("head_dim") or hidden // num_heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=rope.get("rope_theta", cfg.get("rope_theta", 10000.0)),
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bias,
            rope_scaling=scaling,
            eos_token_ids=eos_ids,
            bos_token_id=cfg.get("bos_token_id"),
            extra=cfg,
        )

    @property
    def num_kv_groups(self) -> int:
        """Query heads per KV head (GQA group size)."""
        return self.num_heads // self.num_kv_heads

    def kv_split(self, tp: int) -> int:
        """Distinct KV-head shards at TP `tp` (`kv_split`)."""
        return kv_split(self.num_kv_heads, tp)

    def kv_heads_per_rank(self, tp: int) -> int:
        """KV heads one rank holds at TP `tp` (`kv_heads_per_rank`)."""
        return kv_heads_per_rank(self.num_kv_heads, tp)

    def tp_level_problem(self, tp: int) -> str | None:
        """Why this model cannot run at TP `tp`, or None when it can (`tp_level_problem`)."""
        return tp_level_problem(self.num_kv_heads, self.num_heads, self.intermediate_size, tp)

    def allowed_tp_levels(self, candidates: tuple[int, ...] = DEFAULT_TP_LEVELS) -> tuple[int, ...]:
        """The candidate levels (and 1) this model can run at (`tp_level_problem`)."""
        return tuple(p for p in sorted(set(candidates) | {1}) if self.tp_level_problem(p) is None)

    def check_tp_level(self, tp: int) -> None:
        """Raise a clear ValueError when this model cannot run at TP `tp`."""
        problem = self.tp_level_problem(tp)
        if problem is not None:
            raise ValueError(f"TP {tp} is not supported for this model: {problem}")


def tp_level_problem(num_kv_heads: int, num_heads: int, intermediate: int, tp: int) -> str | None:
    """Why a model of these shapes cannot run at TP `tp`, or None when it can.

    NOTE: a level either divides the KV heads (each rank owns whole GQA groups) or is a
    multiple of them (KV-head replication: each rank owns one KV head, recomputed on
    tp / num_kv_heads ranks, and a slice of its group's query heads); in both cases it must
    divide the query heads and the intermediate size.
    """
    if tp < 1:
        return "it must be >= 1"
    if num_kv_heads % tp and tp % num_kv_heads:
        return (
            f"it must divide the KV heads ({num_kv_heads}) or be a multiple of them "
            "(KV-head replication)"
        )
    if num_heads % tp:
        return f"it must divide the query heads ({num_heads})"
    if intermediate % tp:
        return f"it must divide the intermediate size ({intermediate})"
    return None


def kv_split(num_kv_heads: int, tp: int) -> int:
    """Distinct KV-head shards at TP `tp`: `tp` when it divides the KV heads, else (KV-head
    replication) one per KV head, each held by `tp / num_kv_heads` ranks."""
    return min(tp, num_kv_heads)


def kv_heads_per_rank(num_kv_heads: int, tp: int) -> int:
    """KV heads one rank holds (and stores per token in its pages) at TP `tp`.

    NOTE: `kv_split(H, tp) * kv_heads_per_rank(H, tp) == H` at every allowed level.
    """
    return max(1, num_kv_heads // tp)


def mlp_blocks(cfg: ModelConfig, levels: tuple[int, ...]) -> int:
    """Number of gate/up interleave blocks so every level's shard is one contiguous slice."""
    blocks = math.lcm(*levels)
    if cfg.intermediate_size % blocks:
        raise ValueError(f"intermediate size {cfg.intermediate_size} not divisible by {blocks}")
    return blocks
