"""A sequence's KV in a wire layout, for moving it to another host worker process.

Inside one process KV moves device to device (kv_transfer.py). Between host worker processes
it travels as one tensor of shape (layers, 2, tokens, kv_heads, head_dim): every head of every
layer at TP 1, tokens in order. Both ends plan the move with the same `plan_pieces` as a TP
migration, against a virtual device `WIRE` holding that tensor: the sender's devices pack the
pieces they hold (`KVTransfer.pack`), the receiver's devices unpack the pieces they get
(`KVTransfer.unpack`), so a prefill group of any TP degree hands off to a decode group of any
other one.
"""

from __future__ import annotations

import torch

from nitsum.config import ModelConfig
from nitsum.parallel.topology import GroupShape
from nitsum.pool.devices import Devices
from nitsum.pool.kv_transfer import KVTransfer
from nitsum.pool.migration_plan import Piece, Placement, plan_pieces

# The virtual device that holds the wire tensor (never a real device index).
WIRE = -1


def _wire_placement(page_tokens: int, tokens: int) -> Placement:
    """The wire tensor as a TP-1 placement on `WIRE`: pages 0.. in order, so its slots are
    the token positions."""
    return Placement(GroupShape((WIRE,)), tuple(range(-(-tokens // page_tokens))))


def outgoing_pieces(cfg: ModelConfig, page_tokens: int, tokens: int, src: Placement) -> list[Piece]:
    """Pieces that copy `tokens` tokens of KV from the group `src` into the wire tensor."""
    wire = _wire_placement(page_tokens, tokens)
    return plan_pieces(cfg.num_kv_heads, cfg.num_layers, page_tokens, tokens, src, wire)


def incoming_pieces(cfg: ModelConfig, page_tokens: int, tokens: int, dst: Placement) -> list[Piece]:
    """Pieces that copy `tokens` tokens of KV from the wire tensor into the group `dst`."""
    wire = _wire_placement(page_tokens, tokens)
    return plan_pieces(cfg.num_kv_heads, cfg.num_layers, page_tokens, tokens, wire, dst)


def pack_pieces(transfer: KVTransfer, pieces: list[Piece]) -> list[torch.Tensor]:
    """Device side: the blocks (layers, 2, tokens, heads, head_dim) of the pieces this device
    sends, on the CPU, in order."""
    out = []
    for p in pieces:
        view = transfer.view(p.src_tp, p)
        buf = torch.empty(view.shape[0] * 2 * p.tokens * p.heads * view.shape[-1], dtype=view.dtype)
        slots = p.src_slots.to(view.device)
        if view.device.type == "cpu":
            out.append(transfer.pack(view, slots, p.src_head, p.heads, buf))
        else:  # pack on the device, then one copy to the host
            dev_buf = buf.to(view.device)
            out.append(transfer.pack(view, slots, p.src_head, p.heads, dev_buf).cpu())
    return out


def unpack_pieces(transfer: KVTransfer, pieces: list[Piece], blocks: list[torch.Tensor]) -> None:
    """Device side: scatter the blocks of the pieces this device receives into its pages."""
    for p, block in zip(pieces, blocks, strict=True):
        view = transfer.view(p.dst_tp, p)
        slots = p.dst_slots.to(view.device)
        transfer.unpack(view, slots, p.dst_head, p.heads, block.to(view.device).contiguous())


def export_kv(
    pool: Devices, cfg: ModelConfig, page_tokens: int, tokens: int, src: Placement
) -> torch.Tensor:
    """The wire tensor of the first `tokens` tokens of a sequence placed at `src`."""
    pieces = outgoing_pieces(cfg, page_tokens, tokens, src)
    blocks = pool.kv_out(pieces)
    wire = torch.empty(
        cfg.num_layers, 2, tokens, cfg.num_kv_heads, cfg.head_dim, dtype=blocks[0].dtype
    )
    for p, block in zip(pieces, blocks, strict=True):
        # NOTE: the wire's slots are token positions (`_wire_placement`), so dst_slots index it.
        target = wire[p.layers(cfg.num_layers), :, :, p.dst_head : p.dst_head + p.heads]
        target.index_copy_(2, p.dst_slots, block)
    return wire


def import_kv(
    pool: Devices, cfg: ModelConfig, page_tokens: int, wire: torch.Tensor, dst: Placement
) -> None:
    """Write a wire tensor into the pages of `dst` (already allocated)."""
    tokens = wire.shape[2]
    pieces = incoming_pieces(cfg, page_tokens, tokens, dst)
    blocks = [
        wire[p.layers(cfg.num_layers), :, :, p.src_head : p.src_head + p.heads].index_select(
            2, p.src_slots
        )
        for p in pieces
    ]
    pool.kv_in(pieces, blocks)
