"""Triton kernels against their torch references: on CPU through Triton's interpreter
(conftest.py switches it on), on CUDA compiled."""

import os

import pytest
import torch

triton = pytest.importorskip("triton")
if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and Triton's interpreter is off", allow_module_level=True)
DEV = "cuda" if torch.cuda.is_available() else "cpu"

from nitsum_kernels.kv_pack import pack_ref, slot_view, unpack_ref  # noqa: E402
from nitsum_kernels.kv_pack_triton import pack_triton, unpack_triton  # noqa: E402
from triton_interpret import widen_bf16_dots  # noqa: E402

widen_bf16_dots()


@pytest.mark.parametrize("local_heads, head, heads", [(4, 0, 4), (4, 2, 2), (2, 1, 1)])
def test_pack_unpack_match_reference(local_heads, head, heads):
    g = torch.Generator().manual_seed(0)
    layers, pages, page_elems, hd = 3, 6, 4 * 4 * 8, 8
    storage = torch.randn(layers, 2, pages, page_elems, generator=g).to(DEV)
    view = slot_view(storage, local_heads, hd)
    slots = torch.randperm(view.shape[2], generator=g)[:9].to(DEV)
    out_ref = torch.empty(4096, device=DEV)
    out_tri = torch.full((4096,), float("nan"), device=DEV)
    ref = pack_ref(view, slots, head, heads, out_ref)
    tri = pack_triton(view, slots, head, heads, out_tri)
    assert torch.equal(ref, tri)

    dst_ref, dst_tri = torch.zeros_like(storage), torch.zeros_like(storage)
    targets = torch.randperm(view.shape[2], generator=g)[:9].to(DEV)
    unpack_ref(slot_view(dst_ref, local_heads, hd), targets, head, heads, ref)
    unpack_triton(slot_view(dst_tri, local_heads, hd), targets, head, heads, tri)
    assert torch.equal(dst_ref, dst_tri)
    assert dst_tri.abs().sum() > 0


def _paged_case(g, page_tokens: int, q_heads: int, kv_heads: int, hd: int, dtype):
    """A step of 3 decode queries and 2 prefill chunks (one with cached context) over
    scattered pages: (q, k, v, caches, meta)."""
    from nitsum_kernels.paged_attention import AttentionMetadata, PrefillSegment
    from slots import seq_slots

    num_pages = 40
    order = torch.randperm(num_pages, generator=g).tolist()
    take = lambda n: [order.pop() for _ in range(n)]  # noqa: E731
    decode_lens = [1, page_tokens + 3, 3 * page_tokens]
    prefill = [(0, 2 * page_tokens + 5), (page_tokens + 7, 37)]  # (start, q_len)
    decode_pages = [take(-(-n // page_tokens)) for n in decode_lens]
    seg_pages = [take(-(-(s + n) // page_tokens)) for s, n in prefill]
    slots, segs, row = [], [], len(decode_lens)
    for pages, n in zip(decode_pages, decode_lens, strict=True):
        slots.append(seq_slots(pages, n, page_tokens, n - 1))
    for pages, (start, n) in zip(seg_pages, prefill, strict=True):
        slots.append(seq_slots(pages, start + n, page_tokens, start))
        segs.append(PrefillSegment(row, n, start + n, torch.tensor(pages)))
        row += n
    width = max(map(len, decode_pages))
    meta = AttentionMetadata(
        slot_mapping=torch.cat(slots),
        page_tokens=page_tokens,
        n_decode=len(decode_lens),
        decode_pages=torch.tensor([p + [0] * (width - len(p)) for p in decode_pages]),
        decode_lens=torch.tensor(decode_lens),
        decode_max_len=max(decode_lens),
        prefills=segs,
    )
    shape = (num_pages * page_tokens, kv_heads, hd)
    k_cache = torch.randn(shape, generator=g).to(dtype)
    v_cache = torch.randn(shape, generator=g).to(dtype)
    q = torch.randn(row, q_heads, hd, generator=g).to(dtype)
    k = torch.randn(row, kv_heads, hd, generator=g).to(dtype)
    v = torch.randn(row, kv_heads, hd, generator=g).to(dtype)
    tensors = [t.to(DEV) for t in (q, k, v, k_cache, v_cache)]
    return (*tensors, meta.to(DEV))


@pytest.mark.parametrize(
    "page_tokens, q_heads, kv_heads, hd",
    [(16, 4, 2, 16), (48, 6, 2, 24), (4, 2, 2, 8), (16, 9, 3, 32)],
)
def test_paged_attention_matches_reference(page_tokens, q_heads, kv_heads, hd):
    """Decode and chunked-prefill kernels read the pages in place (any page size, GQA, a head
    dim that is not a power of two) and agree with the torch reference; the caches they
    write are the same."""
    from nitsum_kernels.paged_attention import paged_attention_ref
    from nitsum_kernels.paged_attention_triton import paged_attention_triton

    g = torch.Generator().manual_seed(page_tokens + q_heads)
    q, k, v, kc, vc, meta = _paged_case(g, page_tokens, q_heads, kv_heads, hd, torch.float32)
    kc2, vc2 = kc.clone(), vc.clone()
    ref = paged_attention_ref(q, k, v, kc, vc, meta, hd**-0.5)
    out = paged_attention_triton(q, k, v, kc2, vc2, meta, hd**-0.5)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    # Both against attention written out by hand over each sequence's true context.
    dense = _dense_attention(q, kc, vc, meta, hd**-0.5)
    torch.testing.assert_close(ref, dense, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, dense, atol=1e-5, rtol=1e-5)


def _dense_attention(q, k_cache, v_cache, meta, scale):
    """Per query row: softmax over its sequence's keys 0..position (slots from its pages),
    GQA by repeating KV heads; float64, one row at a time."""
    from slots import seq_slots

    rows = []  # (row, position, pages)
    for i in range(meta.n_decode):
        n = int(meta.decode_lens[i])
        rows.append((i, n - 1, meta.decode_pages[i].tolist()))
    for seg in meta.prefills:
        rows += [(seg.row_start + j, seg.start + j, seg.pages.tolist()) for j in range(seg.q_len)]
    out = torch.empty_like(q)
    r = q.shape[1] // k_cache.shape[1]
    for row, pos, pages in rows:
        slots = seq_slots(pages, pos + 1, meta.page_tokens).to(q.device)
        k = k_cache[slots].double().repeat_interleave(r, dim=1)  # (ctx, Hq, hd)
        v = v_cache[slots].double().repeat_interleave(r, dim=1)
        w = torch.softmax(torch.einsum("hd,chd->hc", q[row].double(), k) * scale, -1)
        out[row] = torch.einsum("hc,chd->hd", w, v).to(q.dtype)
    return out


def test_paged_attention_low_precision_paths():
    """bf16: the reference's CPU matmul path and the Triton kernel both track fp32 attention."""
    from nitsum_kernels.paged_attention import paged_attention_ref
    from nitsum_kernels.paged_attention_triton import paged_attention_triton

    g = torch.Generator().manual_seed(7)
    q, k, v, kc, vc, meta = _paged_case(g, 16, 4, 2, 16, torch.bfloat16)
    exact = paged_attention_ref(q.float(), k.float(), v.float(), kc.float(), vc.float(), meta, 0.25)
    ref = paged_attention_ref(q, k, v, kc.clone(), vc.clone(), meta, 0.25)
    out = paged_attention_triton(q, k, v, kc, vc, meta, 0.25)
    torch.testing.assert_close(ref.float(), exact, atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(out.float(), exact, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize(
    "src_heads, dst_heads, src_head, dst_head, heads",
    [(4, 4, 0, 0, 4), (4, 2, 2, 0, 2), (2, 4, 1, 3, 1)],
)
def test_direct_copy_matches_reference(src_heads, dst_heads, src_head, dst_head, heads):
    """A KV move read straight from a peer's pages (kv_transfer.py): the Triton copy and the
    torch reference's run-wise copies give the same pages, runs and single slots alike."""
    from nitsum_kernels.kv_pack import copy_ref
    from nitsum_kernels.kv_pack_triton import copy_triton

    g = torch.Generator().manual_seed(1)
    layers, pages, page_elems, hd = 3, 8, 4 * 4 * 8, 8
    src = slot_view(torch.randn(layers, 2, pages, page_elems, generator=g).to(DEV), src_heads, hd)
    # Runs and breaks on both sides: 5 consecutive, one alone, 4 consecutive (then reversed).
    src_slots = torch.tensor([3, 4, 5, 6, 7, 20, 27, 28, 29, 30]).to(DEV)
    dst_slots = torch.tensor([9, 10, 11, 12, 13, 2, 17, 16, 15, 14]).to(DEV)
    dst_ref = torch.zeros(layers, 2, pages, page_elems, device=DEV)
    dst_tri = torch.zeros_like(dst_ref)
    copy_ref(
        src, src_slots, src_head, slot_view(dst_ref, dst_heads, hd), dst_slots, dst_head, heads
    )
    copy_triton(
        src, src_slots, src_head, slot_view(dst_tri, dst_heads, hd), dst_slots, dst_head, heads
    )
    assert torch.equal(dst_ref, dst_tri)
    got = slot_view(dst_ref, dst_heads, hd)[:, :, dst_slots, dst_head : dst_head + heads]
    assert torch.equal(got, src[:, :, src_slots, src_head : src_head + heads])
