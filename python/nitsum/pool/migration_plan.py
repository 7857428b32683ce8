"""Which (token, head) ranges of a sequence's KV move where when its TP layout changes.

The plan is the intersection of old and new head ownership (ReMP §3.5 generalizes it to
layers for PP): rank r of a TP-p group owns KV heads [r·H/p, (r+1)·H/p) of every token.
Pieces that share geometry are merged across sequences, so each (src, dst) device pair
moves one aggregated stream.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nitsum.kv.pages import context_slots, tokens_per_page


@dataclass(frozen=True)
class Placement:
    """Where a sequence's KV lives: a TP group (tp = len(members)) and its mirrored pages."""

    members: tuple[int, ...]
    pages: tuple[int, ...]

    @property
    def tp(self) -> int:
        return len(self.members)


@dataclass
class Piece:
    """`heads` KV heads of `len(src_slots)` tokens moving from device `src` to `dst`.

    Slots index each side's flat (slots, local_heads, head_dim) view at its own TP degree;
    `*_head` is the first head within that side's local heads.
    """

    src: int
    dst: int
    src_tp: int
    src_head: int
    dst_tp: int
    dst_head: int
    heads: int
    src_slots: torch.Tensor
    dst_slots: torch.Tensor

    def geometry(self) -> tuple[int, ...]:
        return (
            self.src,
            self.dst,
            self.src_tp,
            self.src_head,
            self.dst_tp,
            self.dst_head,
            self.heads,
        )

    @property
    def tokens(self) -> int:
        return len(self.src_slots)


def plan_pieces(
    kv_heads: int, base_page_tokens: int, tokens: int, old: Placement, new: Placement
) -> list[Piece]:
    """Pieces that rebuild `tokens` tokens of KV from `old` into `new`."""
    src_slots = context_slots(list(old.pages), tokens, tokens_per_page(base_page_tokens, old.tp))
    dst_slots = context_slots(list(new.pages), tokens, tokens_per_page(base_page_tokens, new.tp))
    h_old, h_new = kv_heads // old.tp, kv_heads // new.tp
    pieces = []
    for r_old, src in enumerate(old.members):
        for r_new, dst in enumerate(new.members):
            lo = max(r_old * h_old, r_new * h_new)
            hi = min((r_old + 1) * h_old, (r_new + 1) * h_new)
            if lo < hi:
                pieces.append(
                    Piece(
                        src,
                        dst,
                        old.tp,
                        lo - r_old * h_old,
                        new.tp,
                        lo - r_new * h_new,
                        hi - lo,
                        src_slots,
                        dst_slots,
                    )
                )
    return pieces


def aggregate(pieces: list[Piece]) -> list[Piece]:
    """Merge pieces of equal geometry (across sequences) into one; ordered by (src, dst)."""
    merged: dict[tuple[int, ...], list[Piece]] = {}
    for p in pieces:
        merged.setdefault(p.geometry(), []).append(p)
    out = []
    for geom in sorted(merged):
        group = merged[geom]
        src = torch.cat([p.src_slots for p in group])
        dst = torch.cat([p.dst_slots for p in group])
        out.append(Piece(*geom, src, dst))
    return out
