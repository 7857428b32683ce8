"""Local scheduler: continuous batching with chunked prefill under a token budget.

Each step it (1) advances running sequences, decodes first, then prompts class by class,
(2) admits waiting sequences class by class (feasible, then best-effort, then background,
Nitsum §3.3.2; within a class by `priority`, lower first) while the batch cap, token budget
and free pages allow. A waiting sequence that cannot get in preempts running ones of a lower
class or priority (FastSwitch §3, `_make_room`); when pages run out for a running sequence it
preempts the lowest-priority, newest one. Preemption is by swap or recompute, whichever costs
less; the victim's full pages stay in the prefix cache either way, so it recomputes or copies
back only what was overwritten meanwhile (`kv_space.py`).
A sequence that can no longer get its first token by its TTFT deadline is served last.
Within a class, short prompts may overtake long ones that can spare the tokens
(`prompt_order.py`), so one long prompt does not hold every short one behind it.
"""

from __future__ import annotations

import math
import time
from collections import deque

from nitsum.engine.kv_space import KVSpace
from nitsum.engine.preemption import Preemption, median
from nitsum.engine.prompt_order import deadline_spare, overtaking_order
from nitsum.engine.scheduled import Scheduled
from nitsum.engine.sequence import CLASSES, Sequence, Status
from nitsum.engine.swap import SwapSpace
from nitsum.kv.pages import GroupPages
from nitsum.kv.prefix_cache import PrefixCache


class Scheduler(Preemption):
    """Decides each step's batch. Owns page allocation for its sequences (the preemption
    rules are `Preemption`'s, engine/preemption.py)."""

    def __init__(
        self,
        pages: GroupPages,
        max_batch: int = 64,
        token_budget: int = 512,
        overtaking: bool = True,
        prefix_caching: bool = True,
        swap: SwapSpace | None = None,
    ) -> None:
        # Full pages of finished and preempted sequences, reused by prompts that start with
        # the same tokens (`kv/prefix_cache.py`); None: off.
        cache = PrefixCache(pages.tokens_per_page) if prefix_caching else None
        # Where the sequences' KV lives (device pages, prefix cache, host tier).
        self.kv = KVSpace(pages, cache, swap, step_tokens=token_budget)
        self.max_batch = max_batch
        self.token_budget = token_budget
        # Short prompts overtake long ones that can spare the tokens (`prompt_order.py`);
        # False: plain FCFS within a class (scripts/bench_long_prompt.py compares the two).
        self.overtaking = overtaking
        self.waiting: dict[str, deque[Sequence]] = {c: deque() for c in CLASSES}
        self.running: list[Sequence] = []
        # Durations (s) of recent steps that prefilled at least half a budget of prompt tokens.
        self.full_steps: deque[float] = deque(maxlen=32)
        # Durations (s) of recent steps of any size (the cost of a synchronous swap-in).
        self.steps: deque[float] = deque(maxlen=16)
        # Sequences preempted so far (for pages or for priority), and how many of them swapped.
        self.preemptions = 0
        self.swapped = 0
        # Requests that may start now (None: any). A soft TP binding (pool/binding.py) drains
        # the replicas it borrows: only its own requests start there meanwhile.
        self.admit_only: set[str] | None = None

    @property
    def cache(self) -> PrefixCache | None:
        return self.kv.cache

    @property
    def swap(self) -> SwapSpace | None:
        return self.kv.swap

    # -- queue management ---------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        seq.status = Status.WAITING
        self.waiting[seq.slo_class].append(seq)

    def remove(self, request_id: str) -> Sequence | None:
        """Take a sequence out of every queue and free its pages (abort / finish)."""
        for seq in self.running:
            if seq.request_id == request_id:
                self.running.remove(seq)
                self.kv.free(seq)
                return seq
        for queue in self.waiting.values():
            for seq in queue:
                if seq.request_id == request_id:
                    queue.remove(seq)
                    self.kv.free(seq)
                    return seq
        return None

    def adopt(self, seq: Sequence) -> None:
        """Take over a sequence from another group (after a reconfiguration commit)."""
        if seq.status == Status.RUNNING:
            self.running.append(seq)
        else:
            self.waiting[seq.slo_class].append(seq)

    def detach(self, seq: Sequence) -> None:
        """Forget a sequence without touching its pages (it moves to another group)."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting[seq.slo_class]:
            self.waiting[seq.slo_class].remove(seq)

    def has_work(self) -> bool:
        return bool(self.running) or any(self.waiting.values())

    def num_waiting(self) -> int:
        return sum(len(q) for q in self.waiting.values())

    # -- the step -----------------------------------------------------------------------------
    def demote_late(self, now: float) -> list[Sequence]:
        """Move waiting feasible/best-effort sequences past their TTFT deadline (nothing
        computed yet) to the background queue; returns them.

        NOTE: goodput counts only requests that meet their SLOs, and one not started by its
        TTFT deadline never will: serving it first makes the requests behind it late too (the
        FCFS collapse under overload). It still runs, last. Queues are FIFO by arrival, so
        the late ones are at the front.
        """
        late: list[Sequence] = []
        for slo_class in CLASSES[:-1]:
            queue = self.waiting[slo_class]
            while queue and queue[0].num_computed == 0 and (queue[0].deadline or now) < now:
                seq = queue.popleft()
                seq.slo_class = CLASSES[-1]
                self.waiting[seq.slo_class].append(seq)
                late.append(seq)
        return late

    def step_done(self, batch: list[Scheduled], seconds: float) -> None:
        """Record how long a step took (the estimate behind `demote_hopeless`)."""
        self.steps.append(seconds)
        prompt_tokens = sum(s.q_len for s in batch if s.start < len(s.seq.prompt_ids))
        if 2 * prompt_tokens >= self.token_budget:
            self.full_steps.append(seconds)

    def demote_hopeless(self, now: float) -> list[Sequence]:
        """Serve last the feasible/best-effort sequences whose first token cannot come by
        their deadline even if every step from now gave them all the prompt budget left
        after the sequences ahead of them; returns them.

        NOTE: such a sequence misses its SLO whatever happens, and prefilling it delays the
        ones behind it (the FCFS collapse again, for prompts already started). The estimate
        is a lower bound (the fastest recent full-budget step for every step but the last, no
        new arrivals ahead), so a sequence that could still make it is never demoted. The
        simulator's local scheduler does the same (scheduler-rs/src/sim/group/,
        `demote_hopeless`, which checks admitted prompts only).
        """
        if not self.full_steps:
            return []
        step_s = min(self.full_steps)
        # The order `schedule` gives prompt budget in (counting a lower class ahead would
        # overstate the wait).
        order = [seq for _, seqs in self._prompt_order(now, CLASSES[:-1]) for seq in seqs]
        ahead, hopeless = 0, []
        for seq in order:
            if seq.deadline is None or seq.num_computed >= len(seq.prompt_ids):
                continue
            tokens = ahead + len(seq.prompt_ids) - seq.num_computed
            # Every step but the last, partial one takes at least a full step.
            if now + (math.ceil(tokens / self.token_budget) - 1) * step_s > seq.deadline:
                hopeless.append(seq)
            else:
                ahead = tokens
        for seq in hopeless:
            if seq.status == Status.WAITING:
                self.waiting[seq.slo_class].remove(seq)
                self.waiting[CLASSES[-1]].append(seq)
            seq.slo_class = CLASSES[-1]
        return hopeless

    def _prompt_order(
        self, now: float, classes: tuple[str, ...] = CLASSES
    ) -> list[tuple[str, list[Sequence]]]:
        """Per class, the prompts (started ones, then waiting ones) in the order `schedule`
        gives them budget: FCFS, with short ones overtaking long ones that can spare it."""
        short_max = self.token_budget // 2 if self.overtaking else 0
        decodes = sum(1 for s in self.running if s.remaining <= 1)
        per_step = max(1, self.token_budget - decodes)
        slowest = max(self.full_steps, default=None)
        out: list[tuple[str, list[Sequence]]] = []
        higher = 0  # prompt tokens of the classes served before this one
        for slo_class in classes:

            def spare(
                seq: Sequence, ahead: int, slo_class: str = slo_class, higher: int = higher
            ) -> int:
                if slo_class == CLASSES[-1] or seq.deadline is None:
                    return self.token_budget - short_max
                if slowest is None:
                    return 0  # no step measured yet: nothing is known to be spare
                return deadline_spare(
                    now, seq.deadline, slowest, per_step, higher + ahead, seq.remaining
                )

            fcfs = sorted(
                (
                    *(s for s in self.running if s.remaining > 1 and s.slo_class == slo_class),
                    *self.waiting[slo_class],
                ),
                key=lambda s: s.priority,  # stable: FCFS within a priority
            )
            order = overtaking_order(fcfs, lambda s: s.remaining, spare, short_max)
            out.append((slo_class, order))
            higher += sum(s.remaining for s in order)
        return out

    def schedule(self) -> list[Scheduled]:
        """The next step's batch: decodes, then class by class the started prompts and the
        admissions (`_prompt_order`); allocates the pages it needs."""
        now = time.monotonic()
        self.demote_late(now)
        self.demote_hopeless(now)
        self._make_room()
        batch: list[Scheduled] = []
        budget = self._advance(
            [s for s in self.running if s.remaining <= 1], batch, self.token_budget
        )
        admitting = True
        for slo_class, order in self._prompt_order(now):
            for seq in order:
                if budget == 0:
                    break
                if seq.status == Status.RUNNING:
                    budget = self._advance([seq], batch, budget)
                    continue
                if not admitting or len(self.running) >= self.max_batch:
                    continue
                if seq.waits_for is not None:
                    continue  # a sibling choice waits for its first choice's prefill
                if self.admit_only is not None and seq.request_id not in self.admit_only:
                    continue
                self.kv.reuse_prefix(seq)
                cached = len(seq.pages)  # still valid on the device: no copy back
                q_len = min(seq.remaining, budget)
                if not self._reserve(seq, seq.num_computed + q_len, protected=None):
                    # Back as it was: nothing held on the device (its KV, if any, on host).
                    self.kv.free_device(seq)
                    if not seq.host_pages:
                        seq.num_computed = 0
                    admitting = False  # nobody overtakes a sequence that does not fit yet
                    continue
                self.waiting[slo_class].remove(seq)
                seq.status = Status.RUNNING
                if seq.first_scheduled is None:
                    seq.first_scheduled = now
                self.running.append(seq)
                if seq.host_pages and not self.kv.swap_in(
                    seq, cached, len(batch), median(self.steps)
                ):
                    continue  # it joins a later step, once its KV is back
                batch.append(Scheduled(seq, seq.num_computed, q_len))
                budget -= q_len
        self.kv.write_back()  # NOTE: the next steps' pages, copied out while this one runs
        return batch

    def _advance(self, seqs: list[Sequence], batch: list[Scheduled], budget: int) -> int:
        """Give running `seqs` their next tokens (preempting outside `batch` for pages)."""
        for seq in seqs:
            if budget == 0:
                break
            if seq not in self.running or seq.loading:
                continue  # preempted by an earlier reservation of this step, or still loading
            q_len = min(seq.remaining, budget)
            if not self._reserve(seq, seq.num_computed + q_len, protected=batch):
                continue
            batch.append(Scheduled(seq, seq.num_computed, q_len))
            budget -= q_len
        return budget
