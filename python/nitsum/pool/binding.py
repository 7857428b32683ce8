"""Per-request TP binding (Flying Serving §2.3, §4.2, §5): DP replicas of the plan bound into
a TP group for the requests that need it, and released to DP when those finish.

The window planner owns the layout (`PoolEngine.reconfigure`); a binding only *borrows* the
plan's groups inside one aligned block of devices and gives them back, with nothing rebuilt:
every device already holds the full weights and a warm context for the bound group (the
shard views and communicators of TP switching), so binding is bookkeeping at an iteration
boundary. The replicas' requests keep their KV in their own layout: pages of every layout tag
live in one allocator, and the bound group takes only pages free on all its members.

- **Hard** (latency-oriented requests): the replicas stop at once; their running requests
  pause with their KV intact and resume after release (nothing recomputed).
- **Soft** (throughput-oriented): busy replicas finish what they run and start nothing new;
  an idle replica starts the request in DP mode meanwhile. The group forms once every
  replica is idle; the request's KV then moves to the TP layout (the migration of TP
  switching) and it goes on there.

NOTE (no deadlock under skew): the controller is the only one that launches steps, one
iteration at a time, and a step it launches on a group reaches every member in the same
order. A bound group runs only in iterations where none of its replicas runs, so no rank
ever waits in a collective for a peer that is busy in another one; a slow replica only
delays the iteration boundary.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

from nitsum.config import ModelConfig
from nitsum.engine.engine import Engine
from nitsum.engine.engine_config import EngineConfig
from nitsum.errors import InvalidRequestError
from nitsum.kv.pages import PageAllocator
from nitsum.parallel.topology import GroupShape, TPTopology
from nitsum.pool.devices import Devices
from nitsum.pool.kv_move import Move, commit_moves, transfer_moves

Group = tuple[int, ...]
log = logging.getLogger(__name__)


class Pool(Protocol):
    """What a binder needs of its PoolEngine (pool/pool_engine.py)."""

    pool: Devices
    cfg: ModelConfig
    ecfg: EngineConfig
    topology: TPTopology
    allowed: tuple[int, ...]
    alloc: PageAllocator
    engines: dict[Group, Engine]
    counters: dict[str, int]
    retired: Counter[str]

    def new_engine(self, shape: GroupShape) -> Engine: ...


@dataclass
class Binding:
    """A TP group over the plan's `replicas`, with its own scheduler (`engine`) over the same
    pages; `requests` are the ones it serves."""

    members: Group
    replicas: list[Group]
    engine: Engine
    hard: bool
    formed: bool = False
    requests: set[str] = field(default_factory=set)
    # Counted in `tp_binds` (once its first request was accepted).
    counted: bool = False
    # Soft: requests started in DP mode on an idle replica until the group forms.
    started: dict[str, Group] = field(default_factory=dict)


class Binder:
    """The bindings of one PoolEngine: bind, form, release."""

    def __init__(self, pe: Pool) -> None:
        self.pe = pe
        self.bindings: list[Binding] = []
        self.counters = dict.fromkeys(
            ("tp_binds", "tp_binds_soft", "tp_bound_requests", "tp_binds_clamped"), 0
        )

    # -- what runs ----------------------------------------------------------------------------
    def paused(self) -> set[Group]:
        """Plan groups lent to a formed binding: not stepped."""
        return {g for b in self.bindings if b.formed for g in b.replicas}

    def engines(self) -> list[tuple[Group, Engine]]:
        """Every binding's engine (formed or not: an unformed one may hold queued requests)."""
        return [(b.members, b.engine) for b in self.bindings]

    def active(self) -> list[tuple[Group, Engine]]:
        return [(b.members, b.engine) for b in self.bindings if b.formed]

    # -- which level a request runs at ---------------------------------------------------------
    def levels(
        self, group: Group, context: int, bind_tp: int | None, latency: bool
    ) -> tuple[int, int]:
        """(the TP level a request queued on plan group `group` runs at, the level its
        `context` tokens (prompt + `max_tokens`) need). The triggers: the context; its tier's
        `bind_tp` (a level the pool lacks: the largest one below it); with a TTFT target
        (`latency`) and `EngineConfig.bind_idle`, the largest idle level (`_idle_level`)."""
        allowed = self.pe.allowed
        if bind_tp is not None and bind_tp not in allowed:
            level = max((lv for lv in allowed if lv <= bind_tp), default=1)
            log.warning("bind_tp %d is not a TP level of this pool; binding %d", bind_tp, level)
            self.counters["tp_binds_clamped"] += 1
            bind_tp = level
        need = self._context_tp(context)
        tp = max(bind_tp or 1, need)
        if tp <= len(group) and self.pe.ecfg.bind_idle and latency:
            tp = self._idle_level(group)
        return tp, need

    def _idle_level(self, group: Group) -> int:
        """The largest TP level whose aligned block around `group` holds only plan groups
        with no request at all and no binding (`group`'s own level if none).

        NOTE (the load trigger): under load some replica is always busy, so everything stays
        DP; a binding made here borrows idle devices for one request and gives them back."""
        busy = {d for b in self.bindings for d in b.members}
        for tp in sorted(self.pe.allowed, reverse=True):
            if tp <= len(group):
                break
            block = set(self.pe.topology.group_of(group[0], tp))
            inside = [(g, e) for g, e in self.pe.engines.items() if set(g) & block]
            if block.isdisjoint(busy) and all(
                set(g) <= block and not e.request_ids() for g, e in inside
            ):
                return tp
        return len(group)

    def _context_tp(self, tokens: int) -> int:
        """The smallest TP level whose group's pages hold `tokens` tokens (the largest if
        none does)."""
        alloc = self.pe.alloc
        fits = [
            tp
            for tp in sorted(self.pe.allowed)
            if -(-tokens // alloc.tokens_per_page(tp)) <= alloc.num_pages
        ]
        return fits[0] if fits else max(self.pe.allowed)

    # -- binding --------------------------------------------------------------------------------
    def serve(
        self, tp: int, near: Group, request_id: str, hard: bool, fits_replica: bool
    ) -> tuple[Group, Engine]:
        """The engine a request bound at TP `tp` near plan group `near` is queued on: the
        bound group's, or (soft, the group not formed yet, the request fits one replica) an
        idle replica's, where it starts in DP mode."""
        b = self._binding(tp, near, hard)
        b.requests.add(request_id)
        if not b.formed and fits_replica:
            idle = [g for g in b.replicas if not self.pe.engines[g].running()]
            if idle:
                b.started[request_id] = idle[0]
                self._drain(b)
                return idle[0], self.pe.engines[idle[0]]
        return b.members, b.engine

    def _binding(self, tp: int, near: Group, hard: bool) -> Binding:
        members = self.pe.topology.group_of(near[0], tp)
        for b in self.bindings:
            if b.members == members:
                return b
            if set(b.members) & set(members):
                if set(members) <= set(b.members):
                    return b  # a larger binding holds these devices: serve there
                raise InvalidRequestError(
                    "bind_tp", f"devices {members} are bound as {b.members} until it finishes"
                )
        if members[-1] >= self.pe.pool.num_devices:
            raise InvalidRequestError("bind_tp", f"the pool has no aligned group {members}")
        replicas = [g for g in self.pe.engines if set(g) & set(members)]
        if any(not set(g) <= set(members) for g in replicas):
            raise InvalidRequestError("bind_tp", f"the plan's groups straddle {members}")
        b = Binding(members, replicas, self.pe.new_engine(GroupShape.tp_group(members)), hard)
        self.bindings.append(b)
        if hard:
            self._form(b)  # NOTE: requests are added between steps: an iteration boundary
        else:
            self._drain(b)
        return b

    def admitted(self, request_id: str) -> None:
        """`request_id`, bound, was accepted by its engine: count it (and its binding)."""
        for b in self.bindings:
            if request_id in b.requests:
                self.counters["tp_bound_requests"] += 1
                if not b.counted:
                    b.counted = True
                    self.counters["tp_binds"] += 1
                    self.counters["tp_binds_soft"] += not b.hard

    def _drain(self, b: Binding) -> None:
        """Soft: the replicas start nothing but the binding's own requests from now on."""
        for g in b.replicas:
            own = {r for r, at in b.started.items() if at == g}
            self.pe.engines[g].admit_only(own)

    # -- forming and releasing (at iteration boundaries) ----------------------------------------
    def form(self) -> None:
        """Form every soft binding whose replicas now run only its own requests."""
        for b in self.bindings:
            if not b.formed and all(
                {s.request_id for s in self.pe.engines[g].running()} <= set(b.started)
                for g in b.replicas
            ):
                self._form(b)

    def _form(self, b: Binding) -> None:
        for g in b.replicas:
            replica = self.pe.engines[g]
            # NOTE: the replicas' idle cached pages go (to host, if any), or the bound group
            # could never get them; then their copies finish: they hold pages it might take.
            replica.reclaim(self.pe.alloc.num_pages)
            replica.settle_swaps()
            replica.admit_only(None)
        moves: list[Move] = []
        for request_id, g in b.started.items():
            source = self.pe.engines[g]
            seq = next((s for s in source.sequences() if s.request_id == request_id), None)
            if seq is not None:
                moves.append((seq, b.members, source))
        if moves:
            targets = {b.members: b.engine}
            pe = self.pe
            outcome = transfer_moves(pe.pool, pe.cfg, pe.ecfg.page_tokens, moves, targets)
            commit_moves(moves, targets, outcome)
            pe.counters["kv_migrated_bytes"] += outcome.bytes_moved
        b.started.clear()
        b.formed = True

    def step_done(self) -> None:
        """After a step: a formed binding that has requests but ran none is short of pages
        the paused replicas' sequences hold, so it turns soft (the replicas finish what they
        run and start nothing new) and forms again once they are drained; then `release`."""
        for b in self.bindings:
            e = b.engine
            if b.formed and e.has_unfinished() and not e.running():
                b.formed, b.hard = False, False
                self._drain(b)
        self.release()

    def release(self) -> None:
        """Give back the replicas of every binding whose requests all finished (a soft one's
        may all have finished in DP mode before it formed)."""
        for b in list(self.bindings):
            if b.engine.has_unfinished() or (not b.formed and b.requests):
                continue
            for g in b.replicas:
                self.pe.engines[g].admit_only(None)
            self.pe.retired.update(b.engine.counters())
            b.engine.close()
            self.bindings.remove(b)

    def drop(self, request_id: str) -> None:
        """`request_id` left (finished or aborted) before its group formed."""
        for b in self.bindings:
            b.requests.discard(request_id)
            if b.started.pop(request_id, None) is not None and not b.formed:
                self._drain(b)
