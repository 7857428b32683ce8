"""A reconfiguration as a transaction (ReMP §3.3, §3.8, §3.9): plan, capacity, transfer, commit.

Before the commit point nothing the old layout needs is touched: sequences keep their pages,
layouts and groups; the target pages are new ones. A failure in any phase before it (the plan,
the capacity check, allocation, the transfer, a device that fails) releases the new pages and
leaves every rank on the old layout. The commit swaps page lists, layouts and engines in one
host-side step (every device already has a warm context for every group, so nothing is sent to
them); after it the new layout is the only one.

Capacity: when a target group's pages cannot hold the KV moving into it, the sequences that do
not fit are preempted, lowest priority first (class, then `priority`, then arrival); they keep
no KV and are admitted again like any preempted request (recompute: KV on a host tier belongs
to the old group's layout). `capacity()` says which, before anything changes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import numpy as np

from nitsum.engine.sequence import CLASS_RANK, Sequence
from nitsum.parallel.topology import GroupShape
from nitsum.pool.faults import FaultPlan, SwitchFault
from nitsum.pool.kv_move import (
    Move,
    MoveOutcome,
    ReconfigureReport,
    commit_moves,
    release_new_pages,
    transfer_moves,
)

if TYPE_CHECKING:
    from nitsum.config import ModelConfig
    from nitsum.engine.engine import Engine
    from nitsum.engine.engine_config import EngineConfig
    from nitsum.kv.pages import PageAllocator
    from nitsum.pool.binding import Binder
    from nitsum.pool.devices import Devices

# NOTE: the timed phases (pool/faults.py PHASES) are reported as `timings_ms` in
# `reconfigured` (plan, capacity, transfer, commit_activate, total).
# Reconfigurations the pool's log keeps.
LOG_SIZE = 64


class SwitchablePool(Protocol):
    """What a switch needs of the PoolEngine."""

    pool: Devices
    cfg: ModelConfig
    ecfg: EngineConfig
    alloc: PageAllocator
    engines: dict[GroupShape, Engine]
    binder: Binder
    counters: dict[str, int]
    switch_log: list[dict]

    @property
    def groups(self) -> list[GroupShape]: ...

    def new_engine(self, shape: GroupShape) -> Engine: ...

    def check_shapes(self, shapes: list[GroupShape]) -> None: ...

    def retire(self, engine: Engine) -> None: ...


def priority_key(seq: Sequence) -> tuple[int, int, float]:
    """Lower is more important: class, then `priority`, then arrival."""
    return CLASS_RANK.get(seq.slo_class, len(CLASS_RANK)), seq.priority, seq.arrival


class Switch:
    """One reconfiguration of `pe` to the groups `shapes` (TP groups and pipelines)."""

    def __init__(self, pe: SwitchablePool, shapes: list[GroupShape]) -> None:
        pe.check_shapes(shapes)
        self.pe = pe
        self.groups = list(shapes)

    def _same(self, g: GroupShape) -> bool:
        """Whether group `g` is in the plan and exists now (same shape: kept as it is).
        NOTE: a group reshaped on the same devices is another key: a new engine."""
        return g in self.pe.engines and g in self.groups

    def _moves(self, targets: dict[GroupShape, Engine]) -> list[Move]:
        """Every sequence of a vanishing group to a new group sharing devices (the least
        loaded), most important first: pages go to them first."""
        moves: list[Move] = []
        load = {g: len(e.request_ids()) for g, e in targets.items()}
        for old_group, engine in self.pe.engines.items():
            if self._same(old_group):
                continue
            for seq in engine.sequences():
                near = [g for g in self.groups if g.overlaps(old_group)] or list(self.groups)
                target = min(near, key=lambda g: load[g])
                load[target] += 1
                moves.append((seq, target, engine))
        return sorted(moves, key=lambda m: priority_key(m[0]))

    def _short(
        self, moves: list[Move], free: np.ndarray, spare: Callable[[Engine], int]
    ) -> list[str]:
        """Dry run of the allocation `transfer_moves` makes, in the same order: the requests
        whose KV does not fit (`free`: the allocator's free matrix to count on; `spare`: pages
        a target engine can reclaim)."""
        sizes = {}
        for g in self.groups:
            engine = self.pe.engines.get(g) if self._same(g) else None
            devices = list(g.members)
            sizes[g] = int(free[devices].all(axis=0).sum()) + (spare(engine) if engine else 0)
        short = []
        for seq, target, _ in moves:
            if seq.num_computed == 0 or seq.host_pages:
                continue
            need = -(-seq.num_computed // self.pe.alloc.tokens_per_page(target.tp))
            if need > sizes[target]:
                short.append(seq.request_id)
            else:
                sizes[target] -= need
        return short

    def capacity(self) -> list[str]:
        """The requests this switch would preempt, lowest priority first (nothing changes)."""
        targets = {g: self.pe.engines[g] for g in self.groups if self._same(g)}
        targets |= {g: self.pe.new_engine(g) for g in self.groups if g not in targets}
        free = self.pe.alloc.free.copy()
        for g, engine in self.pe.engines.items():
            if not self._same(g):  # its idle cached pages are freed before the transfer
                owned = {p for seq in engine.sequences() for p in seq.pages}
                idle = sorted(engine.cached_pages() - owned)
                free[np.ix_(list(g.members), idle)] = True
        return self._short(self._moves(targets), free, lambda e: e.num_evictable())[::-1]

    def run(self, mode: str, faults: FaultPlan | None = None) -> ReconfigureReport:
        """Carry the switch out; a failure before the commit leaves the old layout intact.
        `faults`: failures a test injects (None: none)."""
        pe, t = self.pe, [time.perf_counter()]
        timings: dict[str, float] = {}

        def phase(name: str, timed: bool = True) -> None:
            """End phase `name` (its time since the last one), or fail it when asked."""
            if timed:
                now = time.perf_counter()
                timings[name] = (now - t[-1]) * 1e3
                t.append(now)
            if faults is not None:
                faults.check(name)

        if pe.binder.bindings:
            # NOTE: the plan owns the layout, but a binding has borrowed part of it; the
            # next window's plan comes when it has been given back.
            return self._log(
                ReconfigureReport(
                    False, pe.groups, error="a TP binding is active; the plan waits for it"
                )
            )
        targets: dict[GroupShape, Engine] = {}
        moves: list[Move] = []
        outcome: MoveOutcome | None = None
        try:
            targets = {g: pe.engines[g] for g in self.groups if self._same(g)}
            targets |= {g: pe.new_engine(g) for g in self.groups if g not in targets}
            moves = self._moves(targets)
            phase("plan")
            # NOTE: the vanishing groups' idle cached pages are freed first (their devices'
            # pages are what the new groups allocate from); pages a moving sequence shares
            # stay. A rollback keeps their engines, only without that cache.
            for group, engine in pe.engines.items():
                if targets.get(group) is not engine:  # vanishing, or reshaped (same devices)
                    engine.close()
            preempt = self._short(moves, pe.alloc.free, lambda e: e.num_evictable())
            phase("capacity")
            outcome = transfer_moves(
                pe.pool, pe.cfg, pe.ecfg.page_tokens, moves, targets, mode, faults, set(preempt)
            )
            phase("transfer")
            phase("commit", timed=False)  # the last point a failure rolls back from
        except Exception as e:  # noqa: BLE001 - any failure before the commit rolls back
            if outcome is not None:
                release_new_pages(moves, targets, outcome.new_pages)
            timings["total"] = (time.perf_counter() - t[0]) * 1e3
            return self._log(ReconfigureReport(False, pe.groups, timings_ms=timings, error=str(e)))
        # Commit: new pages, layouts and groups become active together.
        commit_moves(moves, targets, outcome)
        for group, engine in pe.engines.items():
            if targets.get(group) is not engine:
                pe.retire(engine)
        pe.engines = targets
        phase("commit_activate")
        pe.counters["reconfigurations"] += 1
        pe.counters["kv_migrated_bytes"] += outcome.bytes_moved
        report = ReconfigureReport(
            True,
            self.groups,
            moved_requests=len(outcome.new_pages),
            recomputed_requests=len(outcome.recompute),
            bytes_moved=outcome.bytes_moved,
            bytes_sent=outcome.bytes_sent,
            preempted=preempt[::-1],
            timings_ms=timings,
        )
        try:
            phase("after_commit", timed=False)
        except SwitchFault as e:
            report.error = f"{e} (after the commit: the new layout stands)"
        timings["total"] = (time.perf_counter() - t[0]) * 1e3
        return self._log(report)

    def _log(self, report: ReconfigureReport) -> ReconfigureReport:
        """Append the report to the pool's reconfiguration log (phase timings included)."""
        log = self.pe.switch_log
        log.append(
            {
                "ok": report.ok,
                "groups": [list(g.members) for g in report.groups],
                "pipelines": {str(list(g.members)): g.tp for g in self.groups if g.is_pipeline},
                "preempted": list(report.preempted),
                "bytes_sent": report.bytes_sent,
                "timings_ms": dict(report.timings_ms),
                "error": report.error,
            }
        )
        del log[:-LOG_SIZE]
        return report
