"""Pack / unpack KV head slices between fragmented pages and a contiguous staging buffer.

Torch reference (CPU and any device). A device's pool storage is (layers, 2, pages,
page_elems); at TP p it is viewed as (layers, 2, slots, heads/p, head_dim). Packing gathers
`heads` heads from `slots` of every layer, K and V, into one contiguous block so that the
transfer is one large message instead of one per page and layer.
"""

from __future__ import annotations

import torch


def slot_view(storage: torch.Tensor, local_heads: int, head_dim: int) -> torch.Tensor:
    """(layers, 2, slots, local_heads, head_dim) view of pool storage."""
    layers, two = storage.shape[:2]
    return storage.view(layers, two, -1, local_heads, head_dim)


def packed_shape(storage: torch.Tensor, tokens: int, heads: int, head_dim: int) -> tuple[int, ...]:
    return (storage.shape[0], 2, tokens, heads, head_dim)


def pack_ref(
    view: torch.Tensor, slots: torch.Tensor, head: int, heads: int, out: torch.Tensor
) -> torch.Tensor:
    """Gather view[:, :, slots, head:head+heads] into flat `out`; returns that part, shaped."""
    shaped = out[: view.shape[0] * 2 * len(slots) * heads * view.shape[-1]].view(
        view.shape[0], 2, len(slots), heads, view.shape[-1]
    )
    torch.index_select(view[:, :, :, head : head + heads], 2, slots, out=shaped)
    return shaped


def unpack_ref(
    view: torch.Tensor, slots: torch.Tensor, head: int, heads: int, packed: torch.Tensor
) -> None:
    """Scatter a packed block back into view[:, :, slots, head:head+heads] (in place)."""
    view[:, :, :, head : head + heads].index_copy_(2, slots, packed)
