"""Triton paged attention for CUDA; same contract as `paged_attention.paged_attention_ref`.

Both kernels read K/V in place from the pool through a page table (no gather of the
context): a key at position `pos` of a sequence lives in slot
`pages[pos // page_tokens] * page_tokens + pos % page_tokens`. They step over positions in
blocks of `BLOCK_N`, so any page size works (a TP level that packs 3× the tokens into a page
makes 48-token pages). Softmax is online and in fp32; GQA maps query head h to KV head
h // (q_heads / kv_heads).

- decode: one program per (sequence, KV head), all the group's query heads at once.
- prefill: one program per (chunk, block of `BLOCK_M` query rows, query head), causal over
  the chunk's cached context plus itself.

Tests run both on CPU under `TRITON_INTERPRET=1` against the torch reference.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from nitsum.kernels.paged_attention import AttentionMetadata

# NOTE: "ieee": fp32 dots stay fp32 (tf32 would miss the 1e-4 logits check).
PRECISION: tl.constexpr = tl.constexpr("ieee")


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


@triton.jit
def _prefill_kernel(
    q,  # (tokens, q_heads, hd)
    k_cache,
    v_cache,
    out,
    pages,  # (chunks, max_pages) page table, rows `stride_pages` apart
    row_starts,  # (chunks,) first query row of each chunk
    q_lens,
    ctx_lens,
    scale,
    page_tokens,
    stride_pages,  # page table row stride
    head_dim,
    q_per_kv,
    stride_qt,
    stride_qh,
    stride_ks,
    stride_kh,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    chunk = tl.program_id(0)
    block = tl.program_id(1)
    head = tl.program_id(2)
    q_len = tl.load(q_lens + chunk)
    if block * BLOCK_M >= q_len:
        return
    ctx_len = tl.load(ctx_lens + chunk)
    row0 = tl.load(row_starts + chunk)
    kv_head = head // q_per_kv
    i = block * BLOCK_M + tl.arange(0, BLOCK_M)  # query index within the chunk
    d = tl.arange(0, BLOCK_D)
    i_ok = i < q_len
    d_ok = d < head_dim
    q_pos = ctx_len - q_len + i  # absolute positions of the queries
    q_ptr = q + (row0 + i)[:, None] * stride_qt + head * stride_qh + d[None, :]
    qv = tl.load(q_ptr, mask=i_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
    table = pages + chunk * stride_pages
    m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    s = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    # Keys past the block's last query position are masked for every row: stop there.
    end = tl.minimum(ctx_len, ctx_len - q_len + (block + 1) * BLOCK_M)
    for start in range(0, end, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        ok = pos < end
        kb, vb = _kv_block(
            k_cache, v_cache, table, pos, ok, page_tokens, kv_head, d, d_ok, stride_ks, stride_kh
        )
        scores = tl.dot(qv, tl.trans(kb), input_precision=PRECISION) * scale  # (M, N)
        visible = (pos[None, :] <= q_pos[:, None]) & ok[None, :]
        scores = tl.where(visible, scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        # NOTE: a padding row (i >= q_len) sees keys too (q_pos is still >= 0), so m_new is
        # finite on every row and exp never sees -inf - -inf.
        p = tl.exp(scores - m_new[:, None])
        alpha = tl.exp(m - m_new)
        s = s * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p, vb, input_precision=PRECISION)
        m = m_new
    o = acc / s[:, None]
    o_ptr = out + (row0 + i)[:, None] * stride_qt + head * stride_qh + d[None, :]
    tl.store(o_ptr, o.to(out.dtype.element_ty), mask=i_ok[:, None] & d_ok[None, :])


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


def prefill_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    out: torch.Tensor,
    block_m: int = 32,
) -> None:
    """Causal attention of every prefill chunk of `meta` over its cached context and itself
    (the chunk's own K/V already written)."""
    segs = meta.prefills
    if not segs:
        return
    table, ints = meta.prefill_table()
    hq, hd = q.shape[1], q.shape[2]
    blocks = triton.cdiv(max(s.q_len for s in segs), block_m)
    _prefill_kernel[(len(segs), blocks, hq)](
        q, k_cache, v_cache, out, table, ints[0], ints[1], ints[2], scale, meta.page_tokens,
        table.stride(0), hd, hq // k_cache.shape[1], q.stride(0), q.stride(1), k_cache.stride(0),
        k_cache.stride(1), BLOCK_M=block_m, BLOCK_N=32, BLOCK_D=max(16, triton.next_power_of_2(hd)),
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
