"""Zero-copy TP shards: a rank's weights are views (slices) of the device's full copy."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nitsum.config import ModelConfig
from nitsum.weights.layout import LayerWeights, ModelWeights


@dataclass(frozen=True)
class HeadRange:
    """The heads a rank owns at one TP level."""

    tp: int
    rank: int
    kv_start: int
    kv_heads: int
    q_heads: int

    @classmethod
    def of(cls, cfg: ModelConfig, tp: int, rank: int) -> HeadRange:
        cfg.check_tp_level(tp)
        if not 0 <= rank < tp:
            raise ValueError(f"rank {rank} out of range for TP {tp}")
        kv = cfg.num_kv_heads // tp
        return cls(tp, rank, rank * kv, kv, kv * cfg.num_kv_groups)


def _rows(t: torch.Tensor, part: int, parts: int) -> torch.Tensor:
    """Rows [part/parts, (part+1)/parts) of t as a view (narrow never copies)."""
    n = t.shape[0] // parts
    return t.narrow(0, part * n, n)


def layer_shard(layer: LayerWeights, tp: int, rank: int) -> LayerWeights:
    """One rank's shard of a layer, as views.

    NOTE: every tensor returned shares storage with `layer`; nothing is copied.
    """
    return LayerWeights(
        input_norm=layer.input_norm,
        post_norm=layer.post_norm,
        qkv=_rows(layer.qkv, rank, tp),
        qkv_bias=None if layer.qkv_bias is None else _rows(layer.qkv_bias, rank, tp),
        o_t=_rows(layer.o_t, rank, tp),
        gate_up=_rows(layer.gate_up, rank, tp),
        down_t=_rows(layer.down_t, rank, tp),
    )


def shard_views(weights: ModelWeights, tp: int, rank: int) -> list[LayerWeights]:
    """Per-layer shard views for (tp, rank). Requires tp to divide weights.mlp_blocks."""
    if weights.mlp_blocks % tp:
        raise ValueError(
            f"TP {tp} was not among the levels the weights were laid out for "
            f"(mlp blocks = {weights.mlp_blocks})"
        )
    return [layer_shard(layer, tp, rank) for layer in weights.layers]
