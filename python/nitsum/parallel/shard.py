"""Zero-copy TP shards: a rank's weights are views (slices) of the device's full copy.

Head ownership at TP p (one definition, `HeadRange` / `kv_head_range`): rank r owns query
heads [r·Hq/p, (r+1)·Hq/p). When p divides the KV heads it owns the whole GQA groups of those
query heads; when p is a multiple of them (KV-head replication) it owns ONE KV head,
g = r // (p / Hkv), which its p / Hkv replica ranks all hold and recompute.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nitsum.config import ModelConfig, kv_heads_per_rank, kv_split
from nitsum.weights.layout import LayerWeights, ModelWeights


def kv_replicas(num_kv_heads: int, tp: int) -> int:
    """Ranks holding each KV head at TP `tp` (1 unless the level replicates KV heads)."""
    return tp // kv_split(num_kv_heads, tp)


def kv_head_range(num_kv_heads: int, tp: int, rank: int) -> range:
    """The KV heads rank `rank` holds at TP `tp` (global head ids)."""
    per = kv_heads_per_rank(num_kv_heads, tp)
    start = rank // kv_replicas(num_kv_heads, tp) * per
    return range(start, start + per)


@dataclass(frozen=True)
class HeadRange:
    """The heads a rank owns at one TP level: KV heads [kv_start, kv_start + kv_heads) and
    query heads [q_start, q_start + q_heads)."""

    tp: int
    rank: int
    kv_start: int
    kv_heads: int
    q_heads: int
    q_start: int

    @classmethod
    def of(cls, cfg: ModelConfig, tp: int, rank: int) -> HeadRange:
        cfg.check_tp_level(tp)
        if not 0 <= rank < tp:
            raise ValueError(f"rank {rank} out of range for TP {tp}")
        kv = kv_head_range(cfg.num_kv_heads, tp, rank)
        q = cfg.num_heads // tp
        return cls(tp, rank, kv.start, len(kv), q, rank * q)


def _rows(t: torch.Tensor, part: int, parts: int) -> torch.Tensor:
    """Rows [part/parts, (part+1)/parts) of t as a view (narrow never copies)."""
    n = t.shape[0] // parts
    return t.narrow(0, part * n, n)


def _attention_rows(
    cfg: ModelConfig, t: torch.Tensor | None, heads: HeadRange
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """A rank's rows of the fused qkv weight or bias `t`: (qkv rows, k/v rows or None)."""
    if t is None:
        return None, None
    if kv_replicas(cfg.num_kv_heads, heads.tp) == 1:
        return _rows(t, heads.rank, heads.tp), None  # whole groups: one contiguous slice
    # NOTE: group g's rows are [q heads of g, k_g, v_g] (weights/layout.py); a replica owns a
    # slice of g's q heads, so its q rows and g's k/v rows are two views.
    hd, r = cfg.head_dim, cfg.num_kv_groups
    group = heads.kv_start * (r + 2) * hd
    q_rows = group + (heads.q_start - heads.kv_start * r) * hd
    return t.narrow(0, q_rows, heads.q_heads * hd), t.narrow(0, group + r * hd, 2 * hd)


def layer_shard(cfg: ModelConfig, layer: LayerWeights, heads: HeadRange) -> LayerWeights:
    """One rank's shard of a layer, as views (`kv_proj` set only at a replicating level).

    NOTE: every tensor returned shares storage with `layer`; nothing is copied.
    """
    tp, rank = heads.tp, heads.rank
    qkv, kv_proj = _attention_rows(cfg, layer.qkv, heads)
    qkv_bias, kv_bias = _attention_rows(cfg, layer.qkv_bias, heads)
    assert qkv is not None
    return LayerWeights(
        input_norm=layer.input_norm,
        post_norm=layer.post_norm,
        qkv=qkv,
        qkv_bias=qkv_bias,
        o_t=_rows(layer.o_t, rank, tp),
        gate_up=_rows(layer.gate_up, rank, tp),
        down_t=_rows(layer.down_t, rank, tp),
        kv_proj=kv_proj,
        kv_bias=kv_bias,
    )


def shard_views(weights: ModelWeights, tp: int, rank: int) -> list[LayerWeights]:
    """Per-layer shard views for (tp, rank). Requires tp to divide weights.mlp_blocks."""
    if weights.mlp_blocks % tp:
        raise ValueError(
            f"TP {tp} was not among the levels the weights were laid out for "
            f"(mlp blocks = {weights.mlp_blocks})"
        )
    heads = HeadRange.of(weights.cfg, tp, rank)
    return [layer_shard(weights.cfg, layer, heads) for layer in weights.layers]
