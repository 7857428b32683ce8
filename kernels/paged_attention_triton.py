"""Triton paged attention for CUDA; same contract as `paged_attention.paged_attention_ref`.

The kernels read K/V in place from the pool through a page table (no gather of the
context): a key at position `pos` of a sequence lives in slot
`pages[pos // page_tokens] * page_tokens + pos % page_tokens`. They step over positions in
blocks of `BLOCK_N`, so any page size works (a TP level that packs 3× the tokens into a page
makes 48-token pages). Softmax is online and in fp32; GQA maps query head h to KV head
h // (q_heads / kv_heads).

- decode: one program per (sequence, KV head), all the group's query heads at once.
- prefill: `prefill_attention_triton.py` (one launch for every chunk of the step, tensor
  cores in bf16/fp16).

Tests run them on CPU under `TRITON_INTERPRET=1` against the torch reference.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from nitsum.kernels.paged_attention import AttentionMetadata
from nitsum.kernels.prefill_attention_triton import prefill_attention_triton


@triton.jit
def _kv_block(
    k_cache, v_cache, table_row, pos, ok, page_tokens, kv_head, d, d_ok, stride_ks, stride_kh
):
    """K and V (fp32, (positions, hd)) at positions `pos` (where `ok`) of one KV head of a
    sequence whose page table row is `table_row`; zeros elsewhere."""
    page = tl.load(table_row + pos // page_tokens, mask=ok, other=0)
    slot = page * page_tokens + pos % page_tokens
    off = slot[:, None] * stride_ks + kv_head * stride_kh + d[None, :]
    valid = ok[:, None] & d_ok[None, :]
    kb = tl.load(k_cache + off, mask=valid, other=0.0).to(tl.float32)
    vb = tl.load(v_cache + off, mask=valid, other=0.0).to(tl.float32)
    return kb, vb


@triton.jit
def _decode_kernel(
    q,  # (n_decode rows of the step, q_heads, hd)
    k_cache,  # (slots, kv_heads, hd)
    v_cache,
    out,
    pages,  # (n_decode, max_pages) page table, rows `stride_pages` apart
    lens,  # (n_decode,)
    scale,
    page_tokens,
    stride_pages,  # page table row stride
    head_dim,
    q_per_kv: tl.constexpr,
    stride_qt,
    stride_qh,
    stride_ks,
    stride_kh,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    r = tl.arange(0, BLOCK_R)
    d = tl.arange(0, BLOCK_D)
    r_ok = r < q_per_kv
    d_ok = d < head_dim
    heads = kv_head * q_per_kv + r
    q_ptr = q + seq * stride_qt + heads[:, None] * stride_qh + d[None, :]
    qv = tl.load(q_ptr, mask=r_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
    length = tl.load(lens + seq)
    table = pages + seq * stride_pages
    m = tl.full((BLOCK_R,), float("-inf"), tl.float32)
    s = tl.zeros((BLOCK_R,), tl.float32)
    acc = tl.zeros((BLOCK_R, BLOCK_D), tl.float32)
    for start in range(0, length, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        ok = pos < length
        kb, vb = _kv_block(
            k_cache, v_cache, table, pos, ok, page_tokens, kv_head, d, d_ok, stride_ks, stride_kh
        )
        scores = tl.sum(qv[:, None, :] * kb[None, :, :], axis=2) * scale  # (R, N)
        scores = tl.where(ok[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        p = tl.exp(scores - m_new[:, None])
        alpha = tl.exp(m - m_new)
        s = s * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * vb[None, :, :], axis=1)
        m = m_new
    o = acc / s[:, None]
    o_ptr = out + seq * stride_qt + heads[:, None] * stride_qh + d[None, :]
    tl.store(o_ptr, o.to(out.dtype.element_ty), mask=r_ok[:, None] & d_ok[None, :])


def decode_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    pages: torch.Tensor,
    lens: torch.Tensor,
    page_tokens: int,
    scale: float,
    out: torch.Tensor,
) -> None:
    """out[:n] = attention of the n decode queries q[:n] (n = pages.shape[0]) over their
    paged contexts. Shapes are those of the step (q, out: (tokens, q_heads, hd))."""
    n, hq, hd = pages.shape[0], q.shape[1], q.shape[2]
    hkv = k_cache.shape[1]
    if n == 0:
        return
    r = hq // hkv
    _decode_kernel[(n, hkv)](
        q, k_cache, v_cache, out, pages, lens, scale, page_tokens, pages.stride(0), hd, r,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
        BLOCK_R=max(2, triton.next_power_of_2(r)), BLOCK_N=32,
        BLOCK_D=max(16, triton.next_power_of_2(hd)),
    )  # fmt: skip


def paged_attention_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """`paged_attention_ref`'s contract with the Triton kernels: write this step's K/V into
    the cache, then attend in place over the pages."""
    k_cache.index_copy_(0, meta.slot_mapping, k)
    v_cache.index_copy_(0, meta.slot_mapping, v)
    # NOTE: the kernels address `out` with q's strides and head dims with unit stride.
    q = q.contiguous()
    out = torch.empty_like(q)
    assert k_cache.stride(-1) == 1 and v_cache.stride() == k_cache.stride()
    # Triton launches on the current device: make it the tensors'.
    on_device = torch.cuda.device(q.device) if q.is_cuda else contextlib.nullcontext()
    with on_device:
        decode_attention_triton(
            q, k_cache, v_cache, meta.decode_pages, meta.decode_lens, meta.page_tokens, scale, out
        )
        prefill_attention_triton(q, k_cache, v_cache, meta, scale, out)
    return out
