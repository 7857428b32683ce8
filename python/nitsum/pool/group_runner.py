"""A pool group's runner: the step inputs of one TP group or pipeline, run on its devices.

The PoolEngine (pool_engine.py) gives each group's `Engine` one of these as its runner
(engine/runner.py `Runner`); it builds the step's inputs by the group's shape (TP, SP by the
shift rule, or a pipeline's micro-batches) and counts the steps of each kind.
"""

from __future__ import annotations

from nitsum.engine.runner import sample_batch
from nitsum.engine.scheduled import Scheduled
from nitsum.engine.step_inputs import StepInputs, build_pipeline_inputs, build_step_inputs
from nitsum.kv.host_tier import PageCopies
from nitsum.kv.pages import GroupPages
from nitsum.kv.swap_copier import SwapProgress
from nitsum.parallel.shift import ShiftRule
from nitsum.parallel.topology import GroupShape
from nitsum.pool.devices import Devices


class GroupRunner:
    """Runs a group's steps on its member devices (all ranks get identical inputs)."""

    def __init__(
        self,
        pool: Devices,
        shape: GroupShape,
        pages: GroupPages,
        shift: ShiftRule,
        counters: dict[str, int],
    ) -> None:
        self.pool = pool
        self.shape = shape
        self.members = shape.members
        self.pages = pages
        self.shift = shift
        self.counters = counters

    def prepare(self, batch: list[Scheduled]) -> StepInputs:
        """The step's inputs; a group of ≥ 2 devices runs it as SP or TP by the shift rule
        (counted in `sp_steps` / `tp_steps`)."""
        if self.shape.is_pipeline:
            # A pipeline: one micro-batch per stage keeps every stage busy.
            self.counters["pp_steps"] += 1
            tpp = self.pages.tokens_per_page
            return build_pipeline_inputs(batch, tpp, self.shape.tp, self.shape.pp)
        tokens = sum(item.q_len for item in batch)
        sp = self.shift.sequence_parallel(self.shape.tp, tokens)
        if self.shape.tp > 1:
            self.counters["sp_steps" if sp else "tp_steps"] += 1
        return build_step_inputs(batch, self.pages.tokens_per_page, sp)

    def run(self, batch: list[Scheduled]) -> list[int]:
        self.pool.launch_step(self.members, self.prepare(batch))
        return sample_batch(self.pool.collect_step(self.members), batch)

    def start_swap(self, ticket: int, out: PageCopies, into: PageCopies) -> None:
        self.pool.start_swap(self.members, ticket, out, into)

    def swap_progress(self, wait_for: int | None = None) -> SwapProgress:
        return self.pool.swap_progress(self.members, wait_for)
