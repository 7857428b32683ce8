"""Paged attention, torch reference (CPU and any device).

Queries of one engine step are laid out decode-first: rows [0, n_decode) are single-token
decode queries, then each prefill chunk's rows. K/V live in a flat slot space
(page * tokens_per_page + offset) of the KV pool.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class PrefillSegment:
    """One prefill chunk: its query rows and its whole context's slots."""

    row_start: int
    q_len: int
    context_slots: torch.Tensor  # (ctx_len,) long, oldest first; last q_len are this chunk
    causal_mask: torch.Tensor | None  # (q_len, ctx_len) bool; None when ctx_len == q_len


@dataclass
class AttentionMetadata:
    """Per-step attention plan, built once and shared by every layer."""

    slot_mapping: torch.Tensor  # (tokens,) long: where each new token's K/V is written
    n_decode: int
    decode_slots: torch.Tensor  # (n_decode, max_ctx) long, padded with slot 0
    decode_mask: torch.Tensor  # (n_decode, 1, 1, max_ctx) bool: True = attend
    prefills: list[PrefillSegment]

    def to(self, device: torch.device | str) -> AttentionMetadata:
        """The same plan with every tensor on `device` (a no-op on CPU)."""
        if torch.device(device).type == "cpu":
            return self
        segs = [
            PrefillSegment(
                s.row_start,
                s.q_len,
                s.context_slots.to(device),
                None if s.causal_mask is None else s.causal_mask.to(device),
            )
            for s in self.prefills
        ]
        return AttentionMetadata(
            self.slot_mapping.to(device),
            self.n_decode,
            self.decode_slots.to(device),
            self.decode_mask.to(device),
            segs,
        )


def paged_attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """Write this step's K/V into the cache, then attend.

    q: (tokens, q_heads, hd); k, v: (tokens, kv_heads, hd); caches: (slots, kv_heads, hd).
    Returns (tokens, q_heads, hd).
    """
    # index_copy_/index_select are much faster than advanced indexing on CPU.
    k_cache.index_copy_(0, meta.slot_mapping, k)
    v_cache.index_copy_(0, meta.slot_mapping, v)
    out = torch.empty_like(q)
    gqa = q.shape[1] != k.shape[1]
    if meta.n_decode:
        nd = meta.n_decode
        flat = meta.decode_slots.flatten()
        shape = (nd, meta.decode_slots.shape[1], *k_cache.shape[1:])
        kd = k_cache.index_select(0, flat).view(shape).transpose(1, 2)  # (nd, kv, ctx, hd)
        vd = v_cache.index_select(0, flat).view(shape).transpose(1, 2)
        qd = q[:nd].unsqueeze(2)  # (nd, q_heads, 1, hd)
        od = F.scaled_dot_product_attention(
            qd, kd, vd, attn_mask=meta.decode_mask, scale=scale, enable_gqa=gqa
        )
        out[:nd] = od.squeeze(2)
    for seg in meta.prefills:
        rows = slice(seg.row_start, seg.row_start + seg.q_len)
        qp = q[rows].transpose(0, 1).unsqueeze(0)  # (1, q_heads, q_len, hd)
        if seg.causal_mask is None:
            # Whole context is this chunk: no need to read back what we just wrote.
            kp, vp = k[rows], v[rows]
        else:
            kp = k_cache.index_select(0, seg.context_slots)
            vp = v_cache.index_select(0, seg.context_slots)
        kp = kp.transpose(0, 1).unsqueeze(0)
        vp = vp.transpose(0, 1).unsqueeze(0)
        op = F.scaled_dot_product_attention(
            qp,
            kp,
            vp,
            attn_mask=seg.causal_mask,
            is_causal=seg.causal_mask is None,
            scale=scale,
            enable_gqa=gqa,
        )
        out[rows] = op.squeeze(0).transpose(0, 1)
    return out
