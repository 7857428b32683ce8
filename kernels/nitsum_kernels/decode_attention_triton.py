"""Triton flash-decoding: paged attention of single-token decode queries, split over the context.

Stage 1 (`_split_kernel`, grid (sequence, KV head, split)): each program takes one KV head's
group of query heads (GQA: `q_per_kv` rows, padded to at least 16 so `tl.dot` runs on tensor
cores) and one range of the sequence's context, walks it in blocks of `BLOCK_N` positions
reading K/V in place through the page table, and keeps an online softmax. It writes its
partial result (output normalised over its range, and the range's log-sum-exp).
Stage 2 (`_merge_kernel`, grid (sequence, query head)) merges the splits by their log-sum-exp.
With one split, stage 1 writes the output directly and stage 2 is skipped.

The number of splits is chosen on the host from host-known sizes only (batch, KV heads, the
step's longest context), never from the device-side lengths: a CUDA graph records one step
over the whole page table and replays it at every length. Each program computes its own range
from its sequence's length on the device, so a short context under many splits leaves the
trailing splits empty; the merge gives those no weight.

Scores and softmax are fp32. With bf16/fp16 inputs the dots take them as they are (fp32
accumulation); with fp32 inputs they run in "ieee" fp32 (the CPU checks need 1e-4).
Tests run on CPU under `TRITON_INTERPRET=1` against float64 attention.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

# Aim for this many stage-1 programs per SM: the sm_90 build (bf16, head dim 128, 64-position
# blocks, 2 stages) takes 38 KiB of shared memory per program, so four or five fit on an
# H100/H200 SM at once, enough loads in flight to approach copy bandwidth; more splits than
# that only add partials to merge. Not yet measured: to tune with
# kernels/benchmarks/bench_attention.py.
PROGRAMS_PER_SM = 4
SMS_OFF_CUDA = 132  # the H100's SM count, for a split count off CUDA (tests, interpreter)
MIN_SPLIT_TOKENS = 256  # below this a split's fixed cost (q load, partial write) dominates
MAX_SPLITS = 64  # bounds the partial buffers and the merge's tile
LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class DecodeConfig:
    """Tile sizes and launch shape of the split kernel."""

    block_n: int  # context positions per loop step
    num_warps: int
    num_stages: int


def decode_config(q_per_kv: int, head_dim: int, page_tokens: int) -> DecodeConfig:
    """Tiles for a group of `q_per_kv` query heads of `head_dim`, pages of `page_tokens`.

    Decode is bound by reading K/V, so a block should be large enough to keep many bytes in
    flight per program (64 positions × 128 dims × 2 bytes = 16 KiB each of K and V) yet leave
    room for two pipeline stages of both in shared memory: 64 positions up to head dim 128,
    32 above. The score tile is (rows, BLOCK_N); many query rows per KV head (≥ 64) get
    8 warps so the fp32 accumulator (rows × head dim) stays in registers. Page size only
    decides how pages are looked up (one lookup per block when BLOCK_N divides it, else one
    per position), not the block: pages are not powers of two in general (a TP level packing
    3× the tokens makes 48-token pages), and a per-position lookup is an L1-cached load.
    """
    del page_tokens  # see above: the kernel's PAGE_ALIGNED
    block_n = 64 if head_dim <= 128 else 32
    num_warps = 8 if q_per_kv >= 64 else 4
    return DecodeConfig(block_n=block_n, num_warps=num_warps, num_stages=2)


@functools.cache
def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return SMS_OFF_CUDA


def decode_splits(batch: int, kv_heads: int, max_len: int, device: torch.device) -> int:
    """How many ranges to split each context into, from host-known sizes only: enough
    programs to fill the GPU (`PROGRAMS_PER_SM` per SM), but no split shorter than
    `MIN_SPLIT_TOKENS` of the longest context, and at most `MAX_SPLITS`."""
    want = triton.cdiv(PROGRAMS_PER_SM * _sm_count(device), max(1, batch * kv_heads))
    most = triton.cdiv(max(1, max_len), MIN_SPLIT_TOKENS)
    return max(1, min(want, most, MAX_SPLITS))


@triton.jit
def _dot(a, b, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """a @ b with fp32 accumulation; UPCAST multiplies fp32 copies of the same values."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b, input_precision=PRECISION)


# NOTE (compiled variants): as in prefill_attention_triton.py, the ints that change from step
# to step (the page table's width, the split count) are not specialized on: a new value must
# not compile a new variant on the serving path.
DECODE_UNSPECIALIZED = ("stride_pages", "SPLITS")


def merge_block(n_splits: int) -> int:
    """BLOCK_S, the merge's vector over splits, in two sizes (16, or up to `MAX_SPLITS`): a
    split count that grows with the context never compiles a new variant."""
    return 16 if n_splits <= 16 else triton.next_power_of_2(max(n_splits, MAX_SPLITS))


@triton.jit(do_not_specialize=DECODE_UNSPECIALIZED)
def _split_kernel(
    q,  # (rows of the step, q_heads, hd); decode rows first
    k_cache,  # (slots, kv_heads, hd)
    v_cache,
    out,  # like q; written only when ONE_SPLIT
    o_part,  # (n, q_heads, SPLITS, hd) fp32: each split's normalised output
    lse_part,  # (n, q_heads, SPLITS) fp32: each split's log2-sum-exp2 of scaled scores
    pages,  # (n, max_pages) page table, rows `stride_pages` apart
    lens,  # (n,) context lengths (≥ 1)
    qk_scale,  # softmax scale · log2(e): scores live in the exp2 domain
    stride_pages,
    stride_qt,
    stride_qh,
    stride_ks,
    stride_kh,
    q_per_kv: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE_TOKENS: tl.constexpr,  # compile-time: `pos // PAGE_TOKENS` becomes a multiply-shift
    SPLITS,  # runtime: a step's split count never compiles a new variant
    ONE_SPLIT: tl.constexpr,  # SPLITS == 1: write `out` directly, no partials
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE_ALIGNED: tl.constexpr,  # BLOCK_N divides PAGE_TOKENS: one page per block
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,  # see `decode_attention_triton`
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    length = tl.load(lens + seq).to(tl.int32)  # positions in int32: cheap index arithmetic
    # NOTE: a split's range is a whole number of blocks, so every block starts at a multiple
    # of BLOCK_N and, when PAGE_ALIGNED, lies within one page.
    chunk = tl.cdiv(tl.cdiv(length, SPLITS), BLOCK_N) * BLOCK_N
    start = split * chunk
    end = tl.minimum(start + chunk, length)

    r = tl.arange(0, BLOCK_R)
    d = tl.arange(0, BLOCK_D)
    r_ok = r < q_per_kv
    heads = kv_head * q_per_kv + r
    # NOTE: with no head-dim padding the masks are per row only (constant along the head
    # dim), so K/V/q loads stay vectorised.
    rd_ok = r_ok[:, None] & (d < HEAD_DIM)[None, :] if BLOCK_D != HEAD_DIM else r_ok[:, None]
    qv = tl.load(q + seq * stride_qt + heads[:, None] * stride_qh + d[None, :], mask=rd_ok, other=0)
    table = pages + seq * stride_pages
    m = tl.full((BLOCK_R,), float("-inf"), tl.float32)
    lsum = tl.zeros((BLOCK_R,), tl.float32)
    acc = tl.zeros((BLOCK_R, BLOCK_D), tl.float32)
    for block in range(start, end, BLOCK_N):
        pos = block + tl.arange(0, BLOCK_N)
        ok = pos < end
        if PAGE_ALIGNED:
            page = tl.load(table + block // PAGE_TOKENS)
            slot = page * PAGE_TOKENS + block % PAGE_TOKENS + tl.arange(0, BLOCK_N)
        else:
            page = tl.load(table + pos // PAGE_TOKENS, mask=ok, other=0)
            slot = page * PAGE_TOKENS + pos % PAGE_TOKENS
        off = slot[:, None] * stride_ks + kv_head * stride_kh + d[None, :]
        nd_ok = ok[:, None] & (d < HEAD_DIM)[None, :] if BLOCK_D != HEAD_DIM else ok[:, None]
        kb = tl.load(k_cache + off, mask=nd_ok, other=0)
        scores = _dot(qv, tl.trans(kb), DOT_PRECISION, UPCAST) * qk_scale  # (R, N)
        scores = tl.where(ok[None, :], scores, float("-inf"))
        # NOTE: every block holds at least one position < end, so m_new is finite on every
        # row (padding rows have q = 0, scores 0) and exp2 never sees -inf - -inf.
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        p = tl.exp2(scores - m_new[:, None])
        alpha = tl.exp2(m - m_new)
        lsum = lsum * alpha + tl.sum(p, axis=1)
        vb = tl.load(v_cache + off, mask=nd_ok, other=0)
        pv = _dot(p.to(vb.dtype), vb, DOT_PRECISION, UPCAST)
        acc = acc * alpha[:, None] + pv
        m = m_new

    seen = lsum > 0  # false only on an empty split (start ≥ length)
    o = acc / tl.where(seen, lsum, 1.0)[:, None]
    if ONE_SPLIT:
        o_ptr = out + seq * stride_qt + heads[:, None] * stride_qh + d[None, :]
        tl.store(o_ptr, o.to(out.dtype.element_ty), mask=rd_ok)
    else:
        row = (seq * (q_per_kv * tl.num_programs(1)) + heads) * SPLITS + split
        tl.store(o_part + row[:, None] * HEAD_DIM + d[None, :], o, mask=rd_ok)
        lse = tl.where(seen, m + tl.log2(tl.where(seen, lsum, 1.0)), float("-inf"))
        tl.store(lse_part + row, lse, mask=r_ok)


@triton.jit(do_not_specialize=("SPLITS",))
def _merge_kernel(
    o_part,  # (n, q_heads, SPLITS, hd) fp32
    lse_part,  # (n, q_heads, SPLITS) fp32
    out,
    stride_qt,
    stride_qh,
    SPLITS,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    row = seq * tl.num_programs(1) + head
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    s_ok = s < SPLITS
    lse = tl.load(lse_part + row * SPLITS + s, mask=s_ok, other=float("-inf"))
    # NOTE: split 0 always covers position 0 (lengths are ≥ 1), so `top` is finite and the
    # empty splits' -inf weigh exactly 0.
    top = tl.max(lse, axis=0)
    w = tl.exp2(lse - top)
    sd_ok = s_ok[:, None] & (d < HEAD_DIM)[None, :]
    part_ptr = o_part + (row * SPLITS + s)[:, None] * HEAD_DIM + d[None, :]
    parts = tl.load(part_ptr, mask=sd_ok, other=0)
    o = tl.sum(parts * w[:, None], axis=0) / tl.sum(w, axis=0)
    o_ptr = out + seq * stride_qt + head * stride_qh + d
    tl.store(o_ptr, o.to(out.dtype.element_ty), mask=d < HEAD_DIM)


def decode_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    pages: torch.Tensor,
    lens: torch.Tensor,
    page_tokens: int,
    scale: float,
    out: torch.Tensor,
    max_len: int,
    splits: int | None = None,
    config: DecodeConfig | None = None,
) -> None:
    """out[:n] = attention of the n decode queries q[:n] (n = pages.shape[0]) over their paged
    contexts, lengths `lens` (on the device, each ≥ 1 and ≤ `max_len`).

    q, out: (tokens, q_heads, hd) with unit stride along hd and the same strides; caches:
    (slots, kv_heads, hd), same strides. `max_len` bounds every length on the host (a CUDA
    graph passes its page table's whole width); `splits` pins the split count (else
    `decode_splits`), `config` the tiles (else `decode_config`).
    """
    n, hq, hd = pages.shape[0], q.shape[1], q.shape[2]
    hkv = k_cache.shape[1]
    if n == 0:
        return
    assert q.stride() == out.stride() and q.stride(-1) == 1
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1
    r = hq // hkv
    cfg = config or decode_config(r, hd, page_tokens)
    n_splits = splits or decode_splits(n, hkv, max_len, q.device)
    assert n_splits >= 1
    block_d = max(16, triton.next_power_of_2(hd))
    if n_splits > 1:
        o_part = torch.empty(n, hq, n_splits, hd, dtype=torch.float32, device=q.device)
        lse_part = torch.empty(n, hq, n_splits, dtype=torch.float32, device=q.device)
    else:
        o_part = lse_part = out  # unused: the kernel writes `out` directly
    precision = "ieee" if q.dtype == torch.float32 else "tf32"  # tf32: ignored for bf16/fp16
    # NOTE: Triton's interpreter (3.9) holds bf16 as raw 16-bit integers and its tl.dot
    # multiplies those; off CUDA the dots take fp32 copies of the same bf16 values (p is
    # still rounded to bf16 first), which is the tensor cores' arithmetic.
    upcast = q.dtype == torch.bfloat16 and not q.is_cuda
    _split_kernel[(n, hkv, n_splits)](
        q, k_cache, v_cache, out, o_part, lse_part, pages, lens, scale * LOG2E, pages.stride(0),
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
        SPLITS=n_splits, q_per_kv=r, HEAD_DIM=hd, PAGE_TOKENS=page_tokens,
        ONE_SPLIT=n_splits == 1, BLOCK_R=max(16, triton.next_power_of_2(r)), BLOCK_N=cfg.block_n,
        BLOCK_D=block_d, PAGE_ALIGNED=page_tokens % cfg.block_n == 0,
        DOT_PRECISION=precision, UPCAST=upcast, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    if n_splits > 1:
        _merge_kernel[(n, hq)](
            o_part, lse_part, out, q.stride(0), q.stride(1), SPLITS=n_splits, HEAD_DIM=hd,
            BLOCK_S=merge_block(n_splits), BLOCK_D=block_d, num_warps=4,
        )  # fmt: skip
