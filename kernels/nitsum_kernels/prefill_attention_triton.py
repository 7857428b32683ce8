"""Triton prefill attention (FlashAttention-2 style) over paged K/V: one launch per engine step
for every prefill chunk of the step (varlen).

The grid is (query tiles of all chunks, KV heads). A program takes one tile of `BLOCK_M`
"folded rows" of one chunk and one KV head: GQA folds the group's `group` query heads into
the rows (folded row f = query row f // group, query head f % group of the group), so each
K/V block is loaded once for the whole group and the score matrix is a real (M × N) dot.
Tiles map to chunks on the device from the chunks' query lengths (a cumulative sum over at
most a few dozen chunks per program), so the host launches once with no per-chunk work.

Each program walks its chunk's context in `BLOCK_N` positions, reading K/V in place through
the page table (`pos // page_tokens`, so any page size works, 16 or 48 alike): first the
blocks every row of the tile sees whole (the cached context and the chunk's earlier
tokens: no mask), then the few blocks on the causal diagonal (masked), and none past the
tile's last query (causal early exit). Softmax is online, in fp32 and base 2.

`tl.dot` takes the K/V dtype: bf16/fp16 run on tensor cores with fp32 accumulation; fp32
inputs use "ieee" dots (tf32 would miss the 1e-4 checks the CPU tests make).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from nitsum_kernels.paged_attention import AttentionMetadata

LOG2_E = math.log2(math.e)


@dataclass(frozen=True)
class PrefillBlocks:
    """Tile shape and launch options of the prefill kernel."""

    block_m: int  # folded (query row, head) rows per program
    block_n: int  # key positions per step of the loop
    num_warps: int
    num_stages: int


def prefill_blocks(
    head_dim: int, group: int, dtype: torch.dtype, max_q_len: int, hopper: bool = True
) -> PrefillBlocks:
    """Block sizes for one step (`hopper`: sm_90 or later).

    - bf16/fp16 (tensor cores): 128 folded rows × 64 keys up to head dim 128 (the FA2 shape:
      the (128, hd) fp32 accumulator and a (128, 64) score tile fit in 8 warps' registers; 3
      stages of K/V blocks fit shared memory); head dim 256 halves both. (Compiled for
      sm_90 at head dim 128: wgmma, 182 registers, no spills, 97 KiB shared memory.) Before
      Hopper, mma.sync holds more in registers: 2 stages, or up to 48 bytes spill on sm_80.
    - fp32 ("ieee" dots, no tensor cores: CPU checks, an fp32 engine): FMA dots keep a
      tile's products in registers, so the tile shrinks as the head dim grows (64 at 32, 16
      at 128: larger ones spill on sm_90).
    - A step of short chunks (q_len · group folded rows under a tile) takes a smaller tile
      (down to 16, tl.dot's minimum), so decode-like chunks don't pay for 128 rows.

    The page size does not enter: K/V are addressed per position (`pos // page_tokens`), so
    a block may straddle pages of any size.
    """
    block_d = max(16, triton.next_power_of_2(head_dim))
    if dtype == torch.float32:
        m = n = min(64, max(16, 2048 // block_d))
        warps, stages = 4, 2
    elif block_d <= 128:
        m, n, warps, stages = 128, 64, 8 if block_d == 128 else 4, 3 if hopper else 2
    else:
        m, n, warps, stages = 64, 32, 8, 2
    m = min(m, max(16, triton.next_power_of_2(max_q_len * group)))
    return PrefillBlocks(m, n, warps, stages)


@triton.jit
def _load_tile(ptrs, rows_ok, d_ok, MASK_ROWS: tl.constexpr, EVEN_D: tl.constexpr):
    """A (rows, BLOCK_D) tile; masks only what may be out of range (an unmasked load of whole
    rows keeps the head-dim accesses vectorized)."""
    if MASK_ROWS and EVEN_D:
        tile = tl.load(ptrs, mask=rows_ok[:, None], other=0.0)
    elif MASK_ROWS:
        tile = tl.load(ptrs, mask=rows_ok[:, None] & d_ok[None, :], other=0.0)
    elif EVEN_D:
        tile = tl.load(ptrs)
    else:
        tile = tl.load(ptrs, mask=d_ok[None, :], other=0.0)
    return tile


@triton.jit
def _attend_block(
    acc, l_i, m_i, qv, q_pos, n0, end, table, k_cache, v_cache, kv_head, d, d_ok,
    stride_ks, stride_kh, qk_scale,
    PAGE: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, EVEN_D: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    """One online-softmax step over key positions [n0, n0 + BLOCK_N). MASKED: positions at
    or past `end` don't exist and a query sees only positions up to its own."""
    pos = n0 + tl.arange(0, BLOCK_N)
    ok = pos < end
    if MASKED:
        page = tl.load(table + pos // PAGE, mask=ok, other=0)
    else:
        page = tl.load(table + pos // PAGE)
    slot = page * PAGE + pos % PAGE  # NOTE: int64 (the table is long): no overflow on big pools
    off = slot[:, None] * stride_ks + kv_head * stride_kh + d[None, :]
    kb = _load_tile(k_cache + off, ok, d_ok, MASKED, EVEN_D)
    vb = _load_tile(v_cache + off, ok, d_ok, MASKED, EVEN_D)
    s = tl.dot(qv, tl.trans(kb), input_precision=PRECISION) * qk_scale  # (M, N), log2 units
    if MASKED:
        s = tl.where((pos[None, :] <= q_pos[:, None]) & ok[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    # NOTE: m_new is finite on every row: the first block a row meets holds a key it sees
    # (see the kernel), so exp2 never sees -inf - -inf.
    p = tl.exp2(s - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = tl.dot(p.to(vb.dtype), vb, acc * alpha[:, None], input_precision=PRECISION)
    return acc, l_i, m_new


# NOTE (compiled variants): Triton compiles a kernel anew for each value of a constexpr and,
# by default, for each int argument being 1 or a multiple of 16 and each pointer being 16-byte
# aligned or not. A compile takes about a second on the serving path, so what varies from
# step to step is left unspecialized (these ints), bucketed (`chunk_block`) or padded (the
# chunks' integers, `AttentionMetadata.prefill_table`).
PREFILL_UNSPECIALIZED = ("stride_pages", "n_chunks")


def chunk_block(n_chunks: int) -> int:
    """BLOCK_C, the kernel's vector over a step's chunks, bucketed to two sizes (16, or 256
    and up as the batch cap needs) so a new chunk count never compiles a new variant; the
    kernel reads only the first `n_chunks`."""
    return 16 if n_chunks <= 16 else max(256, triton.next_power_of_2(n_chunks))


@triton.jit(do_not_specialize=PREFILL_UNSPECIALIZED)
def _prefill_kernel(
    q,  # (tokens, q_heads, hd)
    k_cache,  # (slots, kv_heads, hd)
    v_cache,
    out,  # q's shape and strides
    pages,  # (chunks, max_pages) page table, rows `stride_pages` apart
    stride_pages,
    row_starts,  # (chunks,) first query row of each chunk
    q_lens,
    ctx_lens,
    n_chunks,
    qk_scale,  # softmax scale · log2(e)
    stride_qt,
    stride_qh,
    stride_ks,
    stride_kh,
    PAGE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    GROUP: tl.constexpr,  # query heads per KV head
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_C: tl.constexpr,  # `chunk_block(n_chunks)`
    EVEN_D: tl.constexpr,  # BLOCK_D == HEAD_DIM: no head-dim mask
    PRECISION: tl.constexpr,
):
    # NOTE: tiles run last first: a chunk's later tiles see more keys, so the longest
    # programs start first and the short ones fill the tail.
    tile = tl.num_programs(0) - 1 - tl.program_id(0)
    kv_head = tl.program_id(1)
    # Which chunk: tiles are numbered chunk after chunk, cdiv(q_len · GROUP, BLOCK_M) each.
    c = tl.arange(0, BLOCK_C)
    lens = tl.load(q_lens + c, mask=c < n_chunks, other=0)
    tiles = ((lens * GROUP + BLOCK_M - 1) // BLOCK_M).to(tl.int32)
    ends = tl.cumsum(tiles, axis=0)
    chunk = tl.sum((ends <= tile).to(tl.int32), axis=0)
    t = tile - tl.sum(tl.where(c < chunk, tiles, 0), axis=0)  # tile within the chunk

    q_len = tl.load(q_lens + chunk).to(tl.int32)
    start = (tl.load(ctx_lens + chunk) - q_len).to(tl.int32)  # the chunk's first position
    row0 = tl.load(row_starts + chunk).to(tl.int32)
    folded = q_len * GROUP
    f = t * BLOCK_M + tl.arange(0, BLOCK_M)
    f_ok = f < folded
    i = f // GROUP  # query row within the chunk
    head = kv_head * GROUP + f % GROUP
    q_pos = start + i
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    q_off = (row0 + i)[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :]
    qv = _load_tile(q + q_off, f_ok, d_ok, True, EVEN_D)

    first_row = (t * BLOCK_M) // GROUP
    last_row = (tl.minimum((t + 1) * BLOCK_M, folded) - 1) // GROUP
    # Every row sees positions [0, start + first_row]: whole blocks of those need no mask.
    # The rest, up to the last row's own position, run masked; beyond it nothing is visible.
    full_end = (start + first_row + 1) // BLOCK_N * BLOCK_N
    end = start + last_row + 1
    # NOTE: the first masked block starts at or before every row's own position (full_end
    # <= start + first_row + 1, and when equal the unmasked loop already ran), so no row's
    # running max stays -inf after its first block; padding rows (f >= folded) sit past
    # the last row and see every key the last row sees.
    table = pages + chunk * stride_pages
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    for n0 in range(0, full_end, BLOCK_N):
        acc, l_i, m_i = _attend_block(
            acc, l_i, m_i, qv, q_pos, n0, end, table, k_cache, v_cache, kv_head, d, d_ok,
            stride_ks, stride_kh, qk_scale, PAGE, BLOCK_N, False, EVEN_D, PRECISION,
        )  # fmt: skip
    for n0 in range(full_end, end, BLOCK_N):
        acc, l_i, m_i = _attend_block(
            acc, l_i, m_i, qv, q_pos, n0, end, table, k_cache, v_cache, kv_head, d, d_ok,
            stride_ks, stride_kh, qk_scale, PAGE, BLOCK_N, True, EVEN_D, PRECISION,
        )  # fmt: skip
    o = acc / l_i[:, None]
    o_off = (row0 + i)[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :]
    if EVEN_D:
        tl.store(out + o_off, o.to(out.dtype.element_ty), mask=f_ok[:, None])
    else:
        tl.store(out + o_off, o.to(out.dtype.element_ty), mask=f_ok[:, None] & d_ok[None, :])


def prefill_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    out: torch.Tensor,
) -> None:
    """Causal attention of every prefill chunk of `meta` over its cached context and itself
    (the chunk's own K/V already written), into `out`'s chunk rows; one launch.

    q, out: (tokens, q_heads, hd), head dim contiguous, same strides; caches: (slots,
    kv_heads, hd), head dim contiguous.
    """
    segs = meta.prefills
    if not segs:
        return
    table, ints = meta.prefill_table()
    hq, hd = q.shape[1], q.shape[2]
    kv_heads = k_cache.shape[1]
    group = hq // kv_heads
    hopper = q.is_cuda and torch.cuda.get_device_capability(q.device)[0] >= 9
    blocks = prefill_blocks(hd, group, q.dtype, max(s.q_len for s in segs), hopper)
    # NOTE: the kernel finds a tile's chunk by the same count; the grid must match it.
    tiles = sum(triton.cdiv(s.q_len * group, blocks.block_m) for s in segs)
    precision = "ieee" if q.dtype == torch.float32 else "tf32"  # tf32: unused by bf16/fp16
    block_d = max(16, triton.next_power_of_2(hd))
    _prefill_kernel[(tiles, kv_heads)](
        q, k_cache, v_cache, out, table, table.stride(0), ints[0], ints[1], ints[2], len(segs),
        scale * LOG2_E, q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
        PAGE=meta.page_tokens, HEAD_DIM=hd, GROUP=group, BLOCK_M=blocks.block_m,
        BLOCK_N=blocks.block_n, BLOCK_D=block_d, BLOCK_C=chunk_block(len(segs)),
        EVEN_D=block_d == hd, PRECISION=precision,
        num_warps=blocks.num_warps, num_stages=blocks.num_stages,
    )  # fmt: skip
