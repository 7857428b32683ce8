"""Paged attention: the step's plan (`AttentionMetadata`) and the torch implementation (CPU and
any device; the reference the Triton kernels in `paged_attention_triton.py` are tested against).

Queries of one engine step are laid out decode-first: rows [0, n_decode) are single-token
decode queries, then each prefill chunk's rows. K/V live in pages of `page_tokens` tokens
(at the step's TP level); a flat slot is `page * page_tokens + offset`. Attention reads a
sequence's context page by page (one index per page, not per token), never the whole pool.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from nitsum_kernels.host_copy import to_device

# Below this many (batch · query · key) positions, CPU attention in bf16/fp16 runs upcast to
# fp32 SDPA (measured: 25 vs 52 us at one query over 192 keys; the matmul path wins from
# about 1k positions on).
SMALL_ATTENTION = 1024


@dataclass
class PrefillSegment:
    """One prefill chunk: its query rows and its whole context's pages."""

    row_start: int
    q_len: int
    ctx_len: int  # the chunk's last position + 1; the last q_len positions are this chunk
    pages: torch.Tensor  # (ceil(ctx_len / page_tokens),) long: the context's pages, in order

    @property
    def start(self) -> int:
        """Position of the chunk's first token (tokens before it are cached context)."""
        return self.ctx_len - self.q_len


@dataclass
class AttentionMetadata:
    """Per-step attention plan, built once and shared by every layer."""

    slot_mapping: torch.Tensor  # (tokens,) long: where each new token's K/V is written
    page_tokens: int  # tokens per page at the step's TP level
    n_decode: int
    decode_pages: torch.Tensor  # (n_decode, max_pages) long page table, padded with page 0
    decode_lens: torch.Tensor  # (n_decode,) long: context length of each decode query
    decode_max_len: int  # max of decode_lens, known on the host (reading it would sync CUDA)
    prefills: list[PrefillSegment]
    # Made once per step by the first layer that needs them: the decode rows' mask, the
    # prefill chunks' batched page table (Triton).
    _decode_mask: torch.Tensor | None = field(default=None, init=False, repr=False)
    _prefill_table: tuple[torch.Tensor, torch.Tensor] | None = field(
        default=None, init=False, repr=False
    )

    def prefill_table(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(pages, ints): every prefill chunk's pages as rows of one table padded with page 0,
        and (3, chunks) of their first rows, query lengths and context lengths; on the pages'
        device."""
        if self._prefill_table is None:
            segs = self.prefills
            dev = segs[0].pages.device
            width = max(len(s.pages) for s in segs)
            table = torch.zeros(len(segs), width, dtype=torch.long, device=dev)
            for i, s in enumerate(segs):
                table[i, : len(s.pages)] = s.pages
            # NOTE: rows padded to 16 entries: each row 16-byte aligned whatever the chunk
            # count, so the kernel's pointers to them never compile a new variant.
            pad = [0] * (-len(segs) % 16)
            ints = [
                [s.row_start for s in segs] + pad,
                [s.q_len for s in segs] + pad,
                [s.ctx_len for s in segs] + pad,
            ]
            self._prefill_table = table, to_device(torch.tensor(ints, dtype=torch.long), dev)
        return self._prefill_table

    def decode_mask(self) -> torch.Tensor:
        """(n_decode, 1, 1, decode_max_len) bool: True where a decode row attends, False past
        its context (one mask for every layer of the step).

        NOTE: bool, not an additive float32 mask: SDPA turns a bool mask into the query's
        dtype itself, while cuDNN's SDPA (the default on SM90 with a recent cuDNN) reads a
        float32 mask as if it were the query's bf16/fp16 (pytorch/pytorch#191612), which
        made the bf16 reference's decode rows wrong on CUDA."""
        if self._decode_mask is None:
            keys = torch.arange(self.decode_max_len, device=self.decode_lens.device)
            seen = keys < self.decode_lens[:, None]
            self._decode_mask = seen.view(self.n_decode, 1, 1, self.decode_max_len)
        return self._decode_mask

    def to(self, device: torch.device | str) -> AttentionMetadata:
        """The same plan with every tensor on `device` (a no-op on CPU)."""
        if torch.device(device).type == "cpu":
            return self
        moved = {
            f.name: getattr(self, f.name).to(device)
            for f in fields(self)
            if f.init and isinstance(getattr(self, f.name), torch.Tensor)
        }
        segs = [replace(s, pages=s.pages.to(device)) for s in self.prefills]
        return replace(self, prefills=segs, **moved)


def gather_pages(cache: torch.Tensor, pages: torch.Tensor, page_tokens: int) -> torch.Tensor:
    """(*pages.shape[:-1], n_pages · page_tokens, heads, hd): the pages of a flat
    (slots, heads, hd) cache, in order. Copies whole pages (one index each)."""
    paged = cache.view(-1, page_tokens, *cache.shape[1:])
    out = paged.index_select(0, pages.flatten())
    return out.view(*pages.shape[:-1], pages.shape[-1] * page_tokens, *cache.shape[1:])


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    mask: torch.Tensor | None = None,
    causal: bool = False,
) -> torch.Tensor:
    """Scaled dot-product attention with GQA: q (B, Hq, L, hd), k/v (B, Hkv, C, hd); `mask`
    (bool, True = attend; or float32, added to the scores) broadcasts to (B, 1, L, C);
    `causal` aligns the last query with the last key (queries are the context's last L
    positions). Returns (B, Hq, L, hd)."""
    length, ctx = q.shape[2], k.shape[2]
    if causal and length != ctx:
        # NOTE: SDPA's is_causal aligns the first query with the first key, not the last.
        mask, causal = (
            torch.ones(length, ctx, dtype=torch.bool, device=q.device).tril(ctx - length),
            False,
        )
    gqa = q.shape[1] != k.shape[1]
    if mask is not None and q.device.type != "cpu":
        # NOTE: a masked call off CPU runs SDPA's math backend: it takes any mask with GQA
        # and computes in fp32 (bf16/fp16 inputs are upcast), so the reference is right
        # whatever the fused backends (flash, memory-efficient and cuDNN, whose choice
        # depends on the torch/cuDNN build) accept or get wrong. Its speed matters little:
        # the engine attends with the Triton kernels there; unmasked calls stay fused.
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=gqa
            )
    if q.dtype == torch.float32 or q.device.type != "cpu":
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=gqa
        )
    if q.shape[0] * length * ctx <= SMALL_ATTENTION:
        # Little work: a bf16 batched matmul's fixed cost outweighs upcasting to fp32 SDPA.
        o = F.scaled_dot_product_attention(
            q.float(), k.float(), v.float(), mask, is_causal=causal, scale=scale, enable_gqa=gqa
        )
        return o.to(q.dtype)
    # NOTE: on CPU, SDPA in bf16/fp16 is 4-8x slower than two batched matmuls with the
    # softmax in fp32 (as SDPA computes it), so low precision takes this path there.
    b, hq, _, hd = q.shape
    hkv = k.shape[1]
    qg = q.reshape(b, hkv, (hq // hkv) * length, hd)
    scores = torch.matmul(qg, k.transpose(-1, -2)).float().view(b, hkv, hq // hkv, length, ctx)
    scores = scores * scale
    if causal:
        mask = torch.ones(length, ctx, dtype=torch.bool, device=q.device).tril()
    if mask is not None:
        m = mask if mask.dim() == 4 else mask.view(1, 1, length, ctx)  # (B | 1, 1, L, C)
        if m.dtype == torch.bool:
            scores = scores.masked_fill(~m.unsqueeze(1), float("-inf"))
        else:
            scores = scores + m.unsqueeze(1)
    probs = torch.softmax(scores, -1).to(q.dtype).view(b, hkv, -1, ctx)
    return torch.matmul(probs, v).view(b, hq, length, hd)


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
    out = torch.empty_like(q) if meta.prefills else q
    if meta.n_decode:
        nd, page = meta.n_decode, meta.page_tokens
        max_ctx = meta.decode_max_len
        kd = gather_pages(k_cache, meta.decode_pages, page)[:, :max_ctx].transpose(1, 2)
        vd = gather_pages(v_cache, meta.decode_pages, page)[:, :max_ctx].transpose(1, 2)
        od = attend(q[:nd].unsqueeze(2), kd, vd, scale, meta.decode_mask()).squeeze(2)
        if not meta.prefills:
            return od
        out[:nd] = od
    for seg in meta.prefills:
        rows = slice(seg.row_start, seg.row_start + seg.q_len)
        qp = q[rows].transpose(0, 1).unsqueeze(0)  # (1, q_heads, q_len, hd)
        if seg.start == 0:
            # Whole context is this chunk: no need to read back what we just wrote.
            kp, vp = k[rows], v[rows]
        else:
            kp = gather_pages(k_cache, seg.pages, meta.page_tokens)[: seg.ctx_len]
            vp = gather_pages(v_cache, seg.pages, meta.page_tokens)[: seg.ctx_len]
        kp = kp.transpose(0, 1).unsqueeze(0)
        vp = vp.transpose(0, 1).unsqueeze(0)
        op = attend(qp, kp, vp, scale, causal=True)
        out[rows] = op.squeeze(0).transpose(0, 1)
    return out
