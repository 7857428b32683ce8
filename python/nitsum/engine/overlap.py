"""Overlapped steps on one device (vLLM's async scheduling, SGLang's overlap scheduler): the
host schedules and prepares step N+1 while the device still runs step N.

A step's forward and sampling are launched and leave its sampled tokens in a device tensor.
Without reading them, the engine treats every sequence that sampled as going on: its output
ends with a `PENDING` placeholder (so the scheduler sees the token coming), and the next
step's input row for that position is filled on the device from step N's token tensor
(`device_inputs.py`). Only after step N+1 is launched does the host read step N's tokens
(a non-blocking copy into pinned memory and a CUDA event) and apply them: placeholders become
tokens, finished requests end. A request that ended at N but was already in step N+1 wasted
that row: its output there is dropped and its pages are freed once step N+1 is done.

NOTE (when a step runs synchronously): a batch with a sequence that needs its sampled tokens
on the host before its next step can be scheduled or sampled runs the synchronous step (step
N's tokens applied first): a grammar (the mask of the next step follows the token), logit
processors (penalties count output ids; `min_tokens` masks by the output count), logprobs or
prompt logprobs (computed on the host from the logits), a seeded random request (its CPU
generator draws on the host). Stop strings are the router's; n > 1 choices share only a
prefill (engine/forks.py), which needs no token, so they overlap. A pool's engines (TP groups,
pipelines, SP, the device processes) keep the synchronous path: their steps are run by the
pool across processes (pool/pool_engine.py), whose logits come back to the host anyway.
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from nitsum.engine.device_inputs import TokenFill, device_inputs, pending_rows
from nitsum.engine.engine import Engine
from nitsum.engine.request_output import RequestOutput
from nitsum.engine.runner import ModelRunner
from nitsum.engine.scheduled import Scheduled
from nitsum.engine.sequence import Sequence
from nitsum.sampling import sample_on_device
from nitsum.sampling_processors import wants_processing

# A token sampled on the device and not yet read by the host (an output id placeholder).
PENDING = -2
# "1": overlapped steps on any device (CPU tests); "0": never; unset: on CUDA only.
OVERLAP_ENV = "NITSUM_OVERLAP"


def overlap_wanted(device: str, configured: bool | None = None) -> bool:
    """Whether a single-device engine on `device` overlaps its steps: `configured` if given,
    else the environment's `NITSUM_OVERLAP`, else only on CUDA (on the CPU every op is
    synchronous, so overlapping saves nothing there)."""
    if configured is not None:
        return configured
    env = os.environ.get(OVERLAP_ENV, "")
    if env in ("0", "1"):
        return env == "1"
    return device.startswith("cuda")


def needs_host_tokens(seq: Sequence) -> bool:
    """Whether `seq` needs its sampled tokens on the host before its next step (the NOTE in
    this module's docstring), so its batches run synchronously."""
    p = seq.sampling
    return (
        seq.grammar is not None
        or wants_processing(p)
        or p.logprobs is not None
        or p.prompt_logprobs is not None
        or seq.generator is not None
    )


class LaunchFailed(RuntimeError):
    """Launching a step failed (the cause is `__cause__`); `outputs` are those of the step
    before, applied, so the tokens it computed still reach their requests."""

    def __init__(self, outputs: list[RequestOutput]) -> None:
        super().__init__("launching a step failed")
        self.outputs = outputs


@dataclass
class Launched:
    """A step whose sampled tokens are still on the device."""

    number: int
    batch: list[Scheduled]
    # Per sampled token, in order: its sequence and whether it holds a `PENDING` placeholder
    # for it (False: the token surely ends the request, which sat out the next schedule).
    sampled: list[tuple[Sequence, bool]]
    tokens: torch.Tensor  # (sampled,) long, on the device
    host: torch.Tensor  # its copy on the host (pinned on CUDA), valid once `done`
    done: torch.cuda.Event | None  # None off CUDA: everything already happened
    started: float
    # Row of each sequence with a placeholder in `tokens`, by id(seq).
    rows: dict[int, int] = field(default_factory=dict)
    # id() of every sequence the step computes something of.
    members: set[int] = field(default_factory=set)
    # Requests that ended at the step before while in this one: freed once this one is done.
    finished_inside: list[Sequence] = field(default_factory=list)

    def wait(self) -> list[int]:
        if self.done is not None:
            self.done.synchronize()
        return self.host.tolist()


class OverlapStepper:
    """Drives an engine over a `ModelRunner` with overlapped steps (`Engine.driver`)."""

    def __init__(self, engine: Engine, runner: ModelRunner) -> None:
        self.engine = engine
        self.runner = runner
        self.inflight: Launched | None = None
        self.launches = 0
        # Steps that ran synchronously (a batch with a sequence `needs_host_tokens`).
        self.sync_steps = 0
        # ("launch" | "apply", step number), the latest last: the order the host did things.
        self.events: deque[tuple[str, int]] = deque(maxlen=64)
        # Seconds the host spent waiting for launched steps' tokens: against the wall time,
        # whether steps are bound by the device (the host waits most of the time) or by the
        # host (it hardly waits: the device idles between steps). scripts/bench_gpu.py.
        self.waited_s = 0.0
        # The batch whose tokens the last `_apply` applied (the step log's device-side view).
        self.last_applied: list[Scheduled] = []

    # -- the step -------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule and launch step N+1, then apply step N's tokens (returns their outputs)."""
        engine, prev = self.engine, self.inflight
        batch = self._schedule(prev)
        if batch and not any(needs_host_tokens(item.seq) for item in batch):
            try:
                self.inflight = self._launch(batch, prev)
            except Exception as e:
                self.inflight = None
                raise LaunchFailed(self._apply(prev, None) if prev is not None else []) from e
            outputs = self._apply(prev, self.inflight) if prev is not None else []
        else:
            self.inflight = None
            outputs = self._apply(prev, None) if prev is not None else []
            outputs += self._run_sync(batch)
        if not engine.seqs and self.inflight is not None:
            # Nobody is left to step again: finish the last step now (its pages go back).
            last, self.inflight = self.inflight, None
            outputs += self._apply(last, None)
        return outputs

    def settle(self) -> None:
        inflight = self.inflight
        if inflight is not None and inflight.done is not None:
            inflight.done.synchronize()

    def _schedule(self, prev: Launched | None) -> list[Scheduled]:
        """The next batch, as if every sequence of `prev` went on. NOTE: one whose token at
        `prev` surely ends it (its length limit) sits out, so no row is wasted on it."""
        running = self.engine.scheduler.running
        ending = [] if prev is None else [s for s, pending in prev.sampled if not pending]
        ending = [s for s in ending if s in running]
        for seq in ending:
            running.remove(seq)
        try:
            return self.engine.begin_step()
        finally:
            running.extend(ending)

    def _launch(self, batch: list[Scheduled], prev: Launched | None) -> Launched:
        """Forward and sample `batch` on the device; its placeholders' ids come from `prev`."""
        engine = self.engine
        fill = None
        if prev is not None:
            dst, src = pending_rows(batch, prev.rows, PENDING)
            fill = TokenFill(dst, src, prev.tokens) if dst else None
        seqs = [item.seq for item in batch if item.sample]
        with torch.inference_mode():
            device = self.runner.model.weights.embed.device
            inputs = device_inputs(self.runner.prepare(batch), device, fill)
            tokens = sample_on_device(self.runner.forward(inputs), [s.sampling for s in seqs])
            done: torch.cuda.Event | None = None
            if tokens.is_cuda:
                host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
                host.copy_(tokens, non_blocking=True)
                done = torch.cuda.Event()
                done.record(torch.cuda.current_stream(tokens.device))
            else:
                host = tokens
        run = Launched(self.launches, batch, [], tokens, host, done, time.monotonic())
        run.members = {id(item.seq) for item in batch}
        self.launches += 1
        self.events.append(("launch", run.number))
        for item in batch:  # what the step will have computed, known now
            item.seq.num_computed = item.start + item.q_len
            engine.forks.computed(item.seq)
        for row, seq in enumerate(seqs):
            pending = not self._surely_ends(seq)
            if pending:
                seq.output_ids.append(PENDING)
                run.rows[id(seq)] = row
            run.sampled.append((seq, pending))
        return run

    def _surely_ends(self, seq: Sequence) -> bool:
        """Whether the token being sampled ends `seq` whatever it is (its length limit)."""
        n = len(seq.output_ids) + 1
        return n >= seq.sampling.max_tokens or seq.total_len + 1 >= self.engine.max_context

    def _apply(self, run: Launched, after: Launched | None) -> list[RequestOutput]:
        """Read `run`'s tokens (waiting for the device) and apply them; `after` is the step
        launched since, whose placeholders stay."""
        engine = self.engine
        waiting = time.perf_counter()
        tokens = run.wait()
        self.waited_s += time.perf_counter() - waiting
        self.last_applied = run.batch
        self.events.append(("apply", run.number))
        for seq in run.finished_inside:  # NOTE: their last (wasted) step is done now
            engine.scheduler.kv.free(seq)
        engine.scheduler.step_done(run.batch, time.monotonic() - run.started)
        outputs = []
        for (seq, pending), token in zip(run.sampled, tokens, strict=True):
            if engine.seqs.get(seq.request_id) is not seq:
                continue  # aborted meanwhile
            inside = after is not None and id(seq) in after.members
            outputs.append(self._apply_token(seq, token, pending, after if inside else None))
        return outputs

    def _apply_token(
        self, seq: Sequence, token: int, pending: bool, inside: Launched | None
    ) -> RequestOutput:
        """Put `token` in place of `seq`'s placeholder (`pending`). With `inside` (the step
        launched since, which computes some of `seq`) a request the token ends keeps its
        pages until that step is done, and a placeholder `inside` gave it stays last."""
        engine = self.engine
        running = engine.scheduler.running
        later = inside is not None and id(seq) in inside.rows
        placeholders = int(later) + int(pending)
        assert seq.output_ids[len(seq.output_ids) - placeholders :] == [PENDING] * placeholders
        del seq.output_ids[len(seq.output_ids) - placeholders :]
        if inside is None:
            return engine.apply_token(seq, token)
        # Out of the queues while the token applies: a request it ends keeps its pages.
        at = running.index(seq)
        running.pop(at)
        out = engine.apply_token(seq, token)
        if out.finished:
            # As a synchronous step leaves it: the wasted row's KV does not count.
            seq.num_computed = min(seq.num_computed, seq.total_len - 1)
            inside.finished_inside.append(seq)
        else:
            running.insert(at, seq)
            if later:
                seq.output_ids.append(PENDING)
        return out

    def _run_sync(self, batch: list[Scheduled]) -> list[RequestOutput]:
        """The synchronous step over what is left of `batch` once the step before applied
        (a request that ended there is out of it, its pages freed)."""
        engine = self.engine
        batch = [item for item in batch if engine.seqs.get(item.seq.request_id) is item.seq]
        if not batch:
            return []
        self.sync_steps += 1
        started = time.monotonic()
        tokens = engine.runner.run(batch)
        return engine.end_step(batch, tokens, time.monotonic() - started)


def enable_overlap(engine: Engine, runner: ModelRunner) -> OverlapStepper:
    """Let `engine` (over `runner`) step overlapped from now on."""
    stepper = OverlapStepper(engine, runner)
    engine.driver = stepper
    # NOTE: a step is in flight whenever the scheduler runs: an allocation must never wait
    # for a copy behind it (engine/kv_space.py, `reclaim`).
    engine.scheduler.kv.demote_on_demand = False
    return stepper
