"""The varlen prefill kernel (kernels/prefill_attention_triton.py) against float64 attention:
several chunks of one step in one launch (fresh and with cached context, one token, lengths
off every tile size, a context over many pages), beside decode rows, GQA 4:1 and 8:1, pages
of 16 and 48 tokens, bf16/fp16 (tensor-core dots) and fp32 ("ieee" dots). On CPU through
Triton's interpreter (conftest.py), on CUDA compiled."""

import os

import pytest
import torch

triton = pytest.importorskip("triton")
if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and Triton's interpreter is off", allow_module_level=True)
DEV = "cuda" if torch.cuda.is_available() else "cpu"

from nitsum_kernels.paged_attention import AttentionMetadata, PrefillSegment  # noqa: E402
from nitsum_kernels.paged_attention_triton import paged_attention_triton  # noqa: E402
from nitsum_kernels.prefill_attention_triton import (  # noqa: E402
    prefill_attention_triton,
    prefill_blocks,
)
from slots import seq_slots  # noqa: E402
from triton_interpret import widen_bf16_dots  # noqa: E402

widen_bf16_dots()

# (start, q_len) of a step's chunks: a 1-token prompt; one token after a cached context; a
# fresh prompt whose folded rows end mid-tile; a chunk after a context of many pages; a
# chunk after a context that ends mid-page.
CHUNKS = [(0, 1), (37, 1), (0, 75), (430, 45), (21, 130)]
DECODE_LENS = [1, 50, 97]
TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 1e-2}


def _step(g, page, kv_heads, group, hd, dtype, chunks=CHUNKS, decode_lens=DECODE_LENS):
    """A mixed step over scattered pages, this step's K/V already in the caches:
    (q, k_cache, v_cache, meta) on DEV."""
    need = [-(-n // page) for n in decode_lens] + [-(-(s + n) // page) for s, n in chunks]
    num_pages = sum(need) + 3
    order = torch.randperm(num_pages, generator=g).tolist()
    owned = [[order.pop() for _ in range(n)] for n in need]
    segs, row = [], len(decode_lens)
    for pages, (start, n) in zip(owned[len(decode_lens) :], chunks, strict=True):
        segs.append(PrefillSegment(row, n, start + n, torch.tensor(pages)))
        row += n
    width = max(need[: len(decode_lens)], default=1)
    decode_pages = torch.zeros(len(decode_lens), width, dtype=torch.long)
    for i, p in enumerate(owned[: len(decode_lens)]):
        decode_pages[i, : len(p)] = torch.tensor(p)
    slots = [seq_slots(p, n, page, n - 1) for p, n in zip(owned, decode_lens, strict=False)]
    slots += [seq_slots(s.pages.tolist(), s.ctx_len, page, s.start) for s in segs]
    meta = AttentionMetadata(
        slot_mapping=torch.cat(slots),
        page_tokens=page,
        n_decode=len(decode_lens),
        decode_pages=decode_pages,
        decode_lens=torch.tensor(decode_lens, dtype=torch.long),
        decode_max_len=max(decode_lens, default=0),
        prefills=segs,
    )
    shape = (num_pages * page, kv_heads, hd)
    k_cache = torch.randn(shape, generator=g).to(dtype)
    v_cache = torch.randn(shape, generator=g).to(dtype)
    q = torch.randn(row, kv_heads * group, hd, generator=g).to(dtype)
    return q.to(DEV), k_cache.to(DEV), v_cache.to(DEV), meta.to(DEV)


def _float64_attention(q, k_cache, v_cache, meta, scale):
    """Each sequence's rows attend causally over its context's slots (queries are its last
    positions), GQA by repeating KV heads; float64 on the CPU."""
    group = q.shape[1] // k_cache.shape[1]
    seqs = [
        (i, 1, int(meta.decode_lens[i]), meta.decode_pages[i].tolist())
        for i in range(meta.n_decode)
    ]
    seqs += [(s.row_start, s.q_len, s.ctx_len, s.pages.tolist()) for s in meta.prefills]
    out = torch.full(q.shape, float("nan"), dtype=torch.float64)
    for row0, n, ctx, pages in seqs:
        slots = seq_slots(pages, ctx, meta.page_tokens)
        k = k_cache.cpu()[slots].double().repeat_interleave(group, 1)  # (ctx, q_heads, hd)
        v = v_cache.cpu()[slots].double().repeat_interleave(group, 1)
        scores = torch.einsum("nhd,chd->hnc", q.cpu()[row0 : row0 + n].double(), k) * scale
        visible = torch.ones(n, ctx, dtype=torch.bool).tril(ctx - n)
        probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
        out[row0 : row0 + n] = torch.einsum("hnc,chd->nhd", probs, v)
    return out


@pytest.mark.parametrize(
    "page, kv_heads, group, hd, dtype",
    [
        (16, 1, 4, 128, torch.bfloat16),
        (48, 1, 8, 128, torch.bfloat16),
        (16, 1, 8, 128, torch.float32),
        (48, 2, 4, 24, torch.float32),
        (48, 2, 4, 16, torch.float16),
    ],
)
def test_mixed_step_matches_float64(page, kv_heads, group, hd, dtype):
    """Decode rows and five prefill chunks in one step through the dispatcher: every row
    equals float64 attention over its own context (rows placed right), within 1e-4 in fp32
    and 1e-2 in bf16/fp16; the step's K/V land in the caches as the reference puts them."""
    g = torch.Generator().manual_seed(page + group + hd)
    q, kc, vc, meta = _step(g, page, kv_heads, group, hd, dtype)
    k_new, v_new = kc[meta.slot_mapping].clone(), vc[meta.slot_mapping].clone()
    # The dispatcher writes this step's K/V itself: start from caches without them.
    kc_in, vc_in = kc.clone(), vc.clone()
    kc_in[meta.slot_mapping] = 0
    vc_in[meta.slot_mapping] = 0
    out = paged_attention_triton(q, k_new, v_new, kc_in, vc_in, meta, hd**-0.5)
    assert torch.equal(kc_in, kc) and torch.equal(vc_in, vc)
    want = _float64_attention(q, kc, vc, meta, hd**-0.5)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.cpu().double(), want, atol=tol, rtol=tol)


def test_prefill_writes_only_its_rows_and_steps_without_decode():
    """The prefill kernel alone, on a step of chunks only and on a mixed one: it fills
    exactly the chunks' rows (decode rows keep what was there) with float64 attention."""
    g = torch.Generator().manual_seed(3)
    for decode_lens in ([], DECODE_LENS):
        q, kc, vc, meta = _step(g, 16, 2, 4, 32, torch.float32, decode_lens=decode_lens)
        out = torch.full_like(q, float("nan"))
        prefill_attention_triton(q, kc, vc, meta, 32**-0.5, out)
        nd = len(decode_lens)
        assert out[:nd].isnan().all() and not out[nd:].isnan().any()
        want = _float64_attention(q, kc, vc, meta, 32**-0.5)
        torch.testing.assert_close(out[nd:].cpu().double(), want[nd:], atol=1e-4, rtol=1e-4)


def test_one_long_chunk_over_many_tiles():
    """One chunk after a long cached context, many tiles of both loops (unmasked context
    blocks, masked diagonal blocks), bf16 on tensor-core dots."""
    g = torch.Generator().manual_seed(5)
    q, kc, vc, meta = _step(g, 48, 1, 4, 64, torch.bfloat16, chunks=[(700, 200)], decode_lens=[])
    out = paged_attention_triton(
        q, kc[meta.slot_mapping], vc[meta.slot_mapping], kc, vc, meta, 0.125
    )
    want = _float64_attention(q, kc, vc, meta, 0.125)
    torch.testing.assert_close(out.cpu().double(), want, atol=1e-2, rtol=1e-2)


def test_block_sizes():
    """Tensor-core tiles for bf16 (128 folded rows at head dim 128), smaller ones for head
    dim 256 and for fp32 (shrinking with the head dim), and a step of short chunks takes a
    tile its rows fill (min 16)."""
    tile = lambda *a: (prefill_blocks(*a).block_m, prefill_blocks(*a).block_n)  # noqa: E731
    assert tile(128, 4, torch.bfloat16, 2048) == (128, 64)
    assert tile(256, 4, torch.bfloat16, 2048) == (64, 32)
    assert tile(128, 4, torch.float32, 2048) == (16, 16)
    assert tile(32, 4, torch.float32, 2048) == (64, 64)
    assert prefill_blocks(128, 8, torch.bfloat16, 3).block_m == 32
    assert prefill_blocks(128, 4, torch.bfloat16, 1).block_m == 16


def test_many_chunks_and_the_variants_a_step_compiles():
    """More chunks than the small BLOCK_C (17 one- to nine-token prompts beside decode rows)
    match float64 attention; chunk counts fall in two compiled sizes, and the chunks'
    integers keep 16-byte aligned rows (a pointer's alignment is a compile key)."""
    from nitsum_kernels.prefill_attention_triton import PREFILL_UNSPECIALIZED, chunk_block

    g = torch.Generator().manual_seed(11)
    chunks = [(3 * (i % 4), 1 + i % 9) for i in range(17)]
    q, kc, vc, meta = _step(g, 16, 2, 4, 32, torch.float32, chunks=chunks)
    out = torch.full_like(q, float("nan"))
    prefill_attention_triton(q, kc, vc, meta, 32**-0.5, out)
    nd = len(DECODE_LENS)
    want = _float64_attention(q, kc, vc, meta, 32**-0.5)
    torch.testing.assert_close(out[nd:].cpu().double(), want[nd:], atol=1e-4, rtol=1e-4)
    assert {chunk_block(n) for n in range(1, 257)} == {16, 256}
    _, ints = meta.prefill_table()
    assert ints.shape == (3, 32) and ints[1, :17].tolist() == [n for _, n in chunks]
    assert set(PREFILL_UNSPECIALIZED) == {"stride_pages", "n_chunks"}


@pytest.mark.skipif(DEV != "cuda", reason="compilation is a GPU matter")
def test_steps_of_other_chunk_counts_widths_and_splits_compile_nothing_new():
    """Once a mixed step ran, steps with other chunk counts (up to 16), page-table widths and
    decode split counts reuse its compiled attention kernels (a compile is ~1 s on the
    serving path)."""
    from nitsum_kernels import decode_attention_triton as dat
    from nitsum_kernels import prefill_attention_triton as pat

    def compiled() -> list[int]:
        kernels = (pat._prefill_kernel, dat._split_kernel, dat._merge_kernel)
        return [sum(len(c[0]) for c in k.device_caches.values()) for k in kernels]

    g = torch.Generator().manual_seed(13)
    counts = []
    # NOTE: decode contexts of 3 to 15 splits: one split (a constexpr, 2 variants) and over
    # 16 (the merge's second size) are other variants, compiled once each as well.
    for n_chunks, ctx in ((2, 40), (3, 300), (7, 900), (16, 1500), (5, 1200)):
        chunks = [(ctx + 7 * i, 60 + i) for i in range(n_chunks)]
        decode_lens = [ctx + 600, 2 * ctx + 700]
        q, kc, vc, meta = _step(
            g, 16, 2, 4, 64, torch.bfloat16, chunks=chunks, decode_lens=decode_lens
        )
        paged_attention_triton(q, None, None, kc, vc, meta, 0.125, kv_written=True)
        counts.append(compiled())
    assert counts[1:] == [counts[0]] * (len(counts) - 1), counts
