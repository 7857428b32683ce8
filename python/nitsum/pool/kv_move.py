"""Moving running sequences between TP groups: the transfer and commit halves of a
reconfiguration (ReMP §3.9) and of a prefill/decode handoff.

`transfer_moves` allocates the target pages and moves the KV (aggregated pieces, pipelined);
until `commit_moves` every sequence keeps its old pages, layout and group, so a failed
transfer just releases the new pages.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from nitsum.engine.engine import Engine
from nitsum.engine.sequence import Sequence, Status
from nitsum.kv.pages import OutOfPages
from nitsum.kv.pool import KVLayout
from nitsum.pool.devices import Devices
from nitsum.pool.kv_transfer import TransferFailed
from nitsum.pool.migration_plan import Piece, Placement, aggregate, plan_pieces

# A sequence, the group it moves to, and the engine it leaves.
Move = tuple[Sequence, tuple[int, ...], Engine]


@dataclass
class ReconfigureReport:
    """What a reconfiguration did and what it cost."""

    ok: bool
    groups: list[tuple[int, ...]]
    moved_requests: int = 0
    recomputed_requests: int = 0
    bytes_moved: int = 0
    timings_ms: dict[str, float] = field(default_factory=dict)
    error: str | None = None


def transfer_moves(
    pool: Devices,
    num_kv_heads: int,
    page_tokens: int,
    moves: list[Move],
    engines: dict[tuple[int, ...], Engine],
    mode: str = "pipelined",
    fail: tuple[int, int] | None = None,
) -> tuple[dict[str, list[int]], set[str], int, float]:
    """Allocate target pages, plan pieces and move the KV of `moves`.

    Returns (new pages by request, requests to recompute, bytes moved (sent to other devices
    and copied locally), plan end time).
    NOTE: source pages are only read; on TransferFailed the new pages are released and
    every sequence still owns its old, intact KV.
    """
    pieces: list[Piece] = []
    new_pages: dict[str, list[int]] = {}
    recompute: set[str] = set()
    for seq, target, _ in moves:
        if seq.num_computed == 0:
            continue
        if seq.host_pages:  # swapped out: host KV stays with its device; recompute instead
            recompute.add(seq.request_id)
            continue
        pages = engines[target].pages
        need = pages.pages_for(seq.num_computed)
        engines[target].reclaim(need)  # NOTE: idle cached pages give way to moved KV
        try:
            new_pages[seq.request_id] = pages.allocate(need)
        except OutOfPages:
            recompute.add(seq.request_id)  # soft preempt: drop KV, re-prefill later
            continue
        old = Placement(seq.layout.members, tuple(seq.pages))
        placement = Placement(target, tuple(new_pages[seq.request_id]))
        pieces += plan_pieces(num_kv_heads, page_tokens, seq.num_computed, old, placement)
    pieces = aggregate(pieces)
    t_plan = time.perf_counter()
    try:
        stats = pool.migrate(pieces, mode, fail) if pieces else []
    except TransferFailed:
        for seq, target, _ in moves:
            if seq.request_id in new_pages:
                engines[target].pages.release(new_pages[seq.request_id])
        raise
    moved = sum(s.bytes_sent + s.bytes_copied_locally for s in stats)
    return new_pages, recompute, moved, t_plan


def commit_moves(
    moves: list[Move],
    engines: dict[tuple[int, ...], Engine],
    new_pages: dict[str, list[int]],
    recompute: set[str],
) -> None:
    """Hand every moved sequence to its target engine with its new pages and layout."""
    for seq, target, source in moves:
        source.detach(seq)
        seq.pages = new_pages.get(seq.request_id, [])
        seq.layout = KVLayout(target)
        if seq.request_id in recompute:
            seq.num_computed, seq.status = 0, Status.WAITING
        engines[target].adopt(seq)
