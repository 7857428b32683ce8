"""Priority preemption and page reservation for the local scheduler (engine/scheduler.py).

A waiting sequence that cannot get in preempts running ones of a strictly lower class or
priority (FastSwitch §3, `_make_room`); a running sequence that runs out of pages preempts
the least important, newest one outside the step (`_reserve`). A victim is swapped out when
that costs less than recomputing it (`KVSpace.swap_is_cheaper`), else recomputed; its full
pages stay in the prefix cache either way.
"""

from __future__ import annotations

from collections import deque

from nitsum.engine.kv_space import KVSpace
from nitsum.engine.scheduled import Scheduled
from nitsum.engine.sequence import CLASS_RANK, Sequence, Status
from nitsum.kv.pages import GroupPages


class Preemption:
    """The scheduler's preemption rules, over the queues and KV space it keeps (a mixin of
    `Scheduler`; the attributes below are the scheduler's)."""

    kv: KVSpace
    running: list[Sequence]
    waiting: dict[str, deque[Sequence]]
    max_batch: int
    token_budget: int
    admit_only: set[str] | None
    full_steps: deque[float]
    preemptions: int
    swapped: int

    @property
    def pages(self) -> GroupPages:
        return self.kv.pages

    @staticmethod
    def _rank(seq: Sequence) -> tuple[int, int]:
        """Importance, lower first: class, then priority within the class."""
        return CLASS_RANK[seq.slo_class], seq.priority

    def _make_room(self) -> None:
        """Priority preemption (FastSwitch §3; the simulator's `preempt_for_higher_classes`):
        for the waiting sequences this step could admit, most important first, preempt the
        least important running sequence (newest first) while the batch is full or the free
        pages cannot hold the waiting one's first chunk.

        NOTE: only a strictly lower class or priority gives way, never an equal one, so
        sequences of one rank never preempt each other back and forth.
        """
        if len(self.running) < self.max_batch and (
            self.pages.num_free >= self.pages.pages_for(self.token_budget)
        ):
            return  # room for a whole step of new tokens: nobody needs to give way
        allowed = self.admit_only
        waiting = sorted(
            (
                s
                for q in self.waiting.values()
                for s in q
                if s.may_preempt and (allowed is None or s.request_id in allowed)
            ),
            key=lambda s: (*self._rank(s), s.arrival),
        )
        budget = self.token_budget
        for seq in waiting:
            if budget <= 0:
                return
            first = min(seq.remaining, budget)
            while len(self.running) >= self.max_batch or (
                self.pages.pages_for(first) > self.num_reclaimable()
            ):
                rank = self._rank(seq)
                victims = [r for r in self.running if self._rank(r) > rank]
                if not victims:
                    return  # the rest are at most as important as this one
                self._preempt(max(victims, key=lambda r: (*self._rank(r), r.arrival)))
            budget -= first

    def _reserve(self, seq: Sequence, tokens: int, protected: list[Scheduled] | None) -> bool:
        """Make `seq` own pages for `tokens` tokens.

        With `protected` given, running sequences outside it (and other than `seq`) may be
        preempted to make room; with None nobody is.
        """
        # NOTE: a victim's pages become idle cached ones, evicted on the next round.
        while not self.kv.allocate(seq, tokens):
            if protected is None:
                return False
            keep = {id(s.seq) for s in protected} | {id(seq)}
            victim = self._pick_victim(keep)
            if victim is None:
                return False
            self._preempt(victim)
        return True

    def _pick_victim(self, keep: set[int]) -> Sequence | None:
        """Lowest class and priority, newest arrival first."""
        candidates = [s for s in self.running if id(s) not in keep]
        if not candidates:
            return None
        return max(candidates, key=lambda s: (*self._rank(s), s.arrival))

    def _preempt(self, seq: Sequence) -> None:
        """Preempt by swap when that is cheaper (`KVSpace.swap_is_cheaper`: its KV is copied
        to host pages), else by recompute. Either way its full device pages stay cached, so
        what nobody overwrites meanwhile needs neither."""
        self.preemptions += 1
        self.running.remove(seq)
        step_s = median(self.full_steps)
        if self.kv.swap_is_cheaper(seq, step_s, self.token_budget) and self.kv.swap_out(seq):
            self.swapped += 1
        else:
            self.kv.free(seq)
            seq.num_computed = 0
        seq.status = Status.WAITING
        self.waiting[seq.slo_class].appendleft(seq)

    def num_reclaimable(self) -> int:
        """Pages free now or as soon as asked (idle cached pages)."""
        return self.kv.num_reclaimable()


def median(xs: deque[float]) -> float | None:
    """The median of recent step times (None: none yet)."""
    return sorted(xs)[len(xs) // 2] if xs else None
