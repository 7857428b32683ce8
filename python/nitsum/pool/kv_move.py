"""Moving running sequences between TP groups: the transfer and commit halves of a
reconfiguration (ReMP §3.9) and of a prefill/decode handoff.

`transfer_moves` allocates the target pages and moves the KV (aggregated pieces, pipelined);
until `commit_moves` every sequence keeps its old pages, layout and group, so a failed
transfer just releases the new pages.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from nitsum.config import ModelConfig
from nitsum.engine.engine import Engine
from nitsum.engine.sequence import Sequence, Status
from nitsum.kv.pages import OutOfPages
from nitsum.parallel.topology import GroupShape
from nitsum.pool.devices import Devices
from nitsum.pool.faults import FaultPlan
from nitsum.pool.kv_transfer import TransferStats
from nitsum.pool.migration_plan import Piece, Placement, aggregate, plan_pieces

# A sequence, the group it moves to, and the engine it leaves.
Move = tuple[Sequence, GroupShape, Engine]


@dataclass
class ReconfigureReport:
    """What a reconfiguration did and what it cost."""

    ok: bool
    groups: list[GroupShape]
    moved_requests: int = 0
    recomputed_requests: int = 0
    # Sent to other devices plus copied within one; `bytes_sent`: only bytes whose owner
    # changed.
    bytes_moved: int = 0
    bytes_sent: int = 0
    # Requests preempted for lack of pages in their new group, lowest priority first.
    preempted: list[str] = field(default_factory=list)
    timings_ms: dict[str, float] = field(default_factory=dict)
    error: str | None = None


@dataclass
class MoveOutcome:
    """What `transfer_moves` did: the new pages by request, the requests to recompute (no KV
    kept), bytes sent to other devices (their owner changed) and copied within one, and when
    its plan was done."""

    new_pages: dict[str, list[int]]
    recompute: set[str]
    bytes_sent: int
    bytes_local: int
    plan_end: float

    @property
    def bytes_moved(self) -> int:
        return self.bytes_sent + self.bytes_local


def transfer_moves(
    pool: Devices,
    cfg: ModelConfig,
    page_tokens: int,
    moves: list[Move],
    engines: dict[GroupShape, Engine],
    mode: str = "pipelined",
    faults: FaultPlan | None = None,
    preempt: set[str] | frozenset[str] = frozenset(),
) -> MoveOutcome:
    """Allocate target pages, plan pieces and move the KV of `moves`, in their order (pages go
    to the first ones); the requests in `preempt` keep no KV (they recompute).

    NOTE: source pages are only read; when the transfer fails (TransferFailed, or DeviceError
    for a device gone) the new pages are released and every sequence still owns its old,
    intact KV.
    """
    new_pages: dict[str, list[int]] = {}
    recompute: set[str] = set(preempt)
    try:
        plan_end, stats = _allocate_and_move(
            pool, cfg, page_tokens, moves, engines, mode, faults, new_pages, recompute
        )
    except Exception:  # TransferFailed, DeviceError (a device gone), ...: nothing committed
        release_new_pages(moves, engines, new_pages)
        raise
    sent = sum(s.bytes_sent for s in stats)
    local = sum(s.bytes_copied_locally for s in stats)
    return MoveOutcome(new_pages, recompute, sent, local, plan_end)


def _allocate_and_move(
    pool: Devices,
    cfg: ModelConfig,
    page_tokens: int,
    moves: list[Move],
    engines: dict[GroupShape, Engine],
    mode: str,
    faults: FaultPlan | None,
    new_pages: dict[str, list[int]],
    recompute: set[str],
) -> tuple[float, list[TransferStats]]:
    """`transfer_moves`' allocation, plan and transfer; fills `new_pages` and `recompute`."""
    pieces: list[Piece] = []
    for seq, target, _ in moves:
        if seq.num_computed == 0 or seq.request_id in recompute:
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
        old = Placement(seq.layout, tuple(seq.pages))
        placement = Placement(engines[target].shape, tuple(new_pages[seq.request_id]))
        pieces += plan_pieces(
            cfg.num_kv_heads, cfg.num_layers, page_tokens, seq.num_computed, old, placement
        )
    pieces = aggregate(pieces)
    plan_end = time.perf_counter()
    return plan_end, pool.migrate(pieces, mode, faults) if pieces else []


def release_new_pages(
    moves: list[Move], engines: dict[GroupShape, Engine], new_pages: dict[str, list[int]]
) -> None:
    """Give back the target pages of a transfer that will not be committed."""
    for seq, target, _ in moves:
        if seq.request_id in new_pages:
            engines[target].pages.release(new_pages[seq.request_id])


def commit_moves(
    moves: list[Move], engines: dict[GroupShape, Engine], outcome: MoveOutcome
) -> None:
    """Hand every moved sequence to its target engine with its new pages and layout."""
    new_pages, recompute = outcome.new_pages, outcome.recompute
    for seq, target, source in moves:
        source.detach(seq)
        seq.pages = new_pages.get(seq.request_id, [])
        seq.layout = engines[target].shape
        if seq.request_id in recompute:
            seq.num_computed, seq.status = 0, Status.WAITING
        engines[target].adopt(seq)
