"""Triton KV pack / unpack for CUDA; same contract as `kv_pack.pack_ref` / `unpack_ref`.

One program moves one (layer·K/V, token) row of `heads · head_dim` contiguous elements, so a
whole migration chunk is a single launch instead of one copy per page and layer. Tests run
these kernels on CPU under `TRITON_INTERPRET=1` against the torch references.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _copy_rows(
    src,
    dst,
    src_rows,
    dst_rows,
    n_tokens,
    src_plane,
    dst_plane,
    src_row_stride,
    dst_row_stride,
    src_col,
    dst_col,
    width,
    BLOCK: tl.constexpr,
):
    # NOTE: offsets in int64: a pool past 2^31 elements (4 GiB of bf16) would wrap in int32.
    plane = tl.program_id(0).to(tl.int64)  # layer * 2 + (K or V)
    i = tl.program_id(1).to(tl.int64)  # token within the chunk
    src_row = tl.load(src_rows + i) if src_rows is not None else i
    dst_row = tl.load(dst_rows + i) if dst_rows is not None else i
    src_base = src + plane * src_plane + src_row * src_row_stride + src_col
    dst_base = dst + plane * dst_plane + dst_row * dst_row_stride + dst_col
    for start in range(0, width, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < width
        tl.store(dst_base + offs, tl.load(src_base + offs, mask=mask), mask=mask)


def _launch(
    src: torch.Tensor,
    dst: torch.Tensor,
    src_rows,
    dst_rows,
    n: int,
    src_col: int,
    dst_col: int,
    width: int,
    src_slots: int,
    dst_slots: int,
) -> None:
    planes = src.shape[0] * 2
    src_row_stride = src.shape[-2] * src.shape[-1] if src.dim() == 5 else width
    dst_row_stride = dst.shape[-2] * dst.shape[-1] if dst.dim() == 5 else width
    block = min(1024, triton.next_power_of_2(width))
    _copy_rows[(planes, n)](
        src,
        dst,
        src_rows,
        dst_rows,
        n,
        src_slots * src_row_stride,
        dst_slots * dst_row_stride,
        src_row_stride,
        dst_row_stride,
        src_col,
        dst_col,
        width,
        BLOCK=block,
    )


def pack_triton(
    view: torch.Tensor, slots: torch.Tensor, head: int, heads: int, out: torch.Tensor
) -> torch.Tensor:
    """Gather view[:, :, slots, head:head+heads] into flat `out`; returns that part, shaped."""
    layers, _, n_slots, _, hd = view.shape
    n = len(slots)
    shaped = out[: layers * 2 * n * heads * hd].view(layers, 2, n, heads, hd)
    if n:
        _launch(view, shaped, slots, None, n, head * hd, 0, heads * hd, n_slots, n)
    return shaped


def unpack_triton(
    view: torch.Tensor, slots: torch.Tensor, head: int, heads: int, packed: torch.Tensor
) -> None:
    """Scatter a packed block back into view[:, :, slots, head:head+heads] (in place)."""
    layers, _, n_slots, _, hd = view.shape
    n = len(slots)
    if n:
        _launch(packed, view, None, slots, n, 0, head * hd, heads * hd, n, n_slots)


def copy_triton(
    src: torch.Tensor,
    src_slots: torch.Tensor,
    src_head: int,
    dst: torch.Tensor,
    dst_slots: torch.Tensor,
    dst_head: int,
    heads: int,
) -> None:
    """dst[:, :, dst_slots, dst_head:+heads] = src[:, :, src_slots, src_head:+heads] in one
    launch; `src` may be a peer's storage mapped by CUDA IPC (read peer to peer)."""
    layers, _, src_n, _, hd = src.shape
    n = len(src_slots)
    if n:
        _launch(src, dst, src_slots, dst_slots, n, src_head * hd, dst_head * hd, heads * hd,
                src_n, dst.shape[2])  # fmt: skip
