"""Which (layer, token, head) ranges of a sequence's KV move where when its layout changes.

The plan is the intersection of old and new ownership in two dimensions (ReMP §3.5): a
pipeline stage owns a contiguous layer range (`parallel.pipeline.stage_layers`), and within a
stage, rank r of its TP degree p holds KV heads `kv_head_range(H, p, r)` of every token
(parallel/shard.py; at a level above H, several ranks hold the same head). A TP group is the
one-stage case. Every byte lands once on each new owner: a new rank gets each (layer, head) it
holds exactly once, read from one old holder (the destination itself when it is one, a local
copy). Pieces that share geometry are merged across sequences, so each (src, dst) device pair
moves one aggregated stream.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from nitsum.config import kv_split
from nitsum.kv.pages import context_slots, tokens_per_page
from nitsum.parallel.pipeline import stage_layers
from nitsum.parallel.shard import kv_head_range, kv_replicas
from nitsum.parallel.topology import GroupShape


@dataclass(frozen=True)
class Placement:
    """Where a sequence's KV lives: its group's shape (the KV layout) and its pages, the same
    ids on every member."""

    shape: GroupShape
    pages: tuple[int, ...]

    @property
    def tp(self) -> int:
        return self.shape.tp

    @property
    def pp(self) -> int:
        return self.shape.pp

    def stage(self, s: int) -> tuple[int, ...]:
        """The members of stage `s`."""
        return self.shape.stage(s)


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
    # Layers [first_layer, end_layer) of the model; end_layer 0: every layer.
    first_layer: int = 0
    end_layer: int = 0

    def layers(self, num_layers: int) -> slice:
        """The piece's layers as a slice of a device's (layers, ...) storage."""
        return slice(self.first_layer, self.end_layer or num_layers)

    def geometry(self) -> tuple[int, ...]:
        return (
            self.src,
            self.dst,
            self.src_tp,
            self.src_head,
            self.dst_tp,
            self.dst_head,
            self.heads,
            self.first_layer,
            self.end_layer,
        )

    @property
    def tokens(self) -> int:
        return len(self.src_slots)


def plan_pieces(
    kv_heads: int,
    num_layers: int,
    base_page_tokens: int,
    tokens: int,
    old: Placement,
    new: Placement,
) -> list[Piece]:
    """Pieces that rebuild `tokens` tokens of KV from `old` into `new`.

    NOTE: every new rank gets each (layer, head) it holds exactly once, even when several new
    ranks hold it (replication); a head several old ranks hold is read from one of them: the
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
    for s_new in range(new.pp):
        wanted_layers = stage_layers(num_layers, new.pp, s_new)
        for s_old in range(old.pp):
            had_layers = stage_layers(num_layers, old.pp, s_old)
            first = max(wanted_layers.start, had_layers.start)
            end = min(wanted_layers.stop, had_layers.stop)
            if first >= end:
                continue
            holders_stage = old.stage(s_old)
            for r_new, dst in enumerate(new.stage(s_new)):
                want = kv_head_range(kv_heads, new.tp, r_new)
                # One representative rank per distinct old shard (replicas hold the same).
                for r_first in range(0, old.tp, replicas):
                    holders = holders_stage[r_first : r_first + replicas]
                    have = kv_head_range(kv_heads, old.tp, r_first)
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
                            first,
                            end,
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
        out.append(replace(group[0], src_slots=src, dst_slots=dst))
    return out
