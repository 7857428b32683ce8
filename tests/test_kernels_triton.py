"""Triton kernels against their torch references, on CPU through Triton's interpreter."""

import os

import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "1")
triton = pytest.importorskip("triton")

from nitsum.kernels.kv_pack import pack_ref, slot_view, unpack_ref  # noqa: E402
from nitsum.kernels.kv_pack_triton import pack_triton, unpack_triton  # noqa: E402


@pytest.mark.parametrize("local_heads, head, heads", [(4, 0, 4), (4, 2, 2), (2, 1, 1)])
def test_pack_unpack_match_reference(local_heads, head, heads):
    g = torch.Generator().manual_seed(0)
    layers, pages, page_elems, hd = 3, 6, 4 * 4 * 8, 8
    storage = torch.randn(layers, 2, pages, page_elems, generator=g)
    view = slot_view(storage, local_heads, hd)
    slots = torch.randperm(view.shape[2], generator=g)[:9]
    out_ref = torch.empty(4096)
    out_tri = torch.full((4096,), float("nan"))
    ref = pack_ref(view, slots, head, heads, out_ref)
    tri = pack_triton(view, slots, head, heads, out_tri)
    assert torch.equal(ref, tri)

    dst_ref, dst_tri = torch.zeros_like(storage), torch.zeros_like(storage)
    targets = torch.randperm(view.shape[2], generator=g)[:9]
    unpack_ref(slot_view(dst_ref, local_heads, hd), targets, head, heads, ref)
    unpack_triton(slot_view(dst_tri, local_heads, hd), targets, head, heads, tri)
    assert torch.equal(dst_ref, dst_tri)
    assert dst_tri.abs().sum() > 0
