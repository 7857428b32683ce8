"""Which (token, head) ranges of a sequence's KV move where when its TP layout changes.

The plan is the intersection of old and new head ownership (ReMP §3.5 generalizes it to
layers for PP): rank r of a TP-p group holds KV heads `kv_head_range(H, p, r)` of every token
(parallel/shard.py; at a level above H, several ranks hold the same head). Pieces that share
geometry are merged across sequences, so each (src, dst) device pair moves one aggregated
stream.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nitsum.config import kv_split
from nitsum.kv.pages import context_slots, tokens_per_page
from nitsum.parallel.shard import kv_head_range, kv_replicas


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
    """Pieces that rebuild `tokens` tokens of KV from `old` into `new`.

    NOTE: every new rank gets each head it holds exactly once, even when several new ranks
    hold it (replication); a head several old ranks hold is read from one of them: the
    destination device itself when it is one (a local copy), else the first.
    """
    src_slots = context_slots(
        list(old.pages), tokens, tokens_per_page(base_page_tokens, kv_split(kv_heads, old.tp))
    )
    dst_slots = context_slots(
        list(new.pages), tokens, tokens_per_page(base_page_tokens, kv_split(kv_heads, new.tp))
    )
    replicas = kv_replicas(kv_heads, old.tp)
    pieces = []
    for r_new, dst in enumerate(new.members):
        want = kv_head_range(kv_heads, new.tp, r_new)
        # One representative rank per distinct old shard (its replicas hold the same heads).
        for first in range(0, old.tp, replicas):
            holders = old.members[first : first + replicas]
            have = kv_head_range(kv_heads, old.tp, first)
            lo, hi = max(have.start, want.start), min(have.stop, want.stop)
            if lo >= hi:
                continue
            src = dst if dst in holders else holders[0]
            pieces.append(
                Piece(
                    src,
                    dst,
                    old.tp,
                    lo - have.start,
                    new.tp,
                    lo - want.start,
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
