"""One JSON line per engine step (`NITSUM_STEP_LOG=path`): what the step ran and where its
time went, to find out why a served load is slower than the profiled steps
(`scripts/step_log_summary.py` reads it; `scripts/gpu_serve.sh` turns it on).

Fields per line: `t` seconds since the log opened (the step's start), `pid` and `engine`
(which process and which of its engines), `ms` the `Engine.step` call's wall time, `gap_ms`
the time since the same engine's previous step returned (the caller's work between steps:
messages, streaming), `rows` / `decode` / `prefill_rows` / `prefill_tokens` the batch
scheduled in this call, `running` / `waiting` the queues after scheduling, `free_pages`,
`preempted` (preemptions since the engine's previous line), `waited_ms` (overlapped steps:
time the host waited for the device inside this call), and for overlapped steps
`applied_decode` / `applied_prefill_tokens`: the batch whose tokens this call applied.

NOTE: an overlapped step launches batch N+1 and applies batch N in the same call: `ms` is the
host's round, bounded from below by the device's time for batch N when the host waits
(`waited_ms` > 0), so what the device ran is the *applied* batch, not the scheduled one.
"""

from __future__ import annotations

import json
import os
import time
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from nitsum.engine.request_output import RequestOutput
    from nitsum.engine.scheduled import Scheduled
    from nitsum.engine.scheduler import Scheduler
    from nitsum.engine.step_driver import StepDriver

STEP_LOG_ENV = "NITSUM_STEP_LOG"


class StepLog:
    """The process's step log: one file, one line per step of any of its engines."""

    _opened: dict[str, StepLog] = {}

    def __init__(self, path: str) -> None:
        # NOTE: line-buffered (a write call per step, microseconds): a server is stopped by
        # a signal, which skips Python's exit, and an idle worker steps no more.
        self._file: IO[str] = open(path, "a", buffering=1)  # noqa: SIM115 - process-long
        self._t0 = time.perf_counter()
        self._pid = os.getpid()
        self._engines = 0

    @classmethod
    def from_env(cls) -> StepLog | None:
        """The log `NITSUM_STEP_LOG` names (one per path and process), or None."""
        path = os.environ.get(STEP_LOG_ENV)
        if not path:
            return None
        if path not in cls._opened:
            cls._opened[path] = cls(path)
        return cls._opened[path]

    def engine_number(self) -> int:
        """A number for one more engine writing here."""
        self._engines += 1
        return self._engines - 1

    def write(
        self,
        engine: int,
        started: float,
        ended: float,
        previous_end: float | None,
        batch: list[Scheduled],
        scheduler: Scheduler,
        preempted: int,
        waited_s: float,
        applied: list[Scheduled] | None = None,
    ) -> None:
        """Write one step's line (`started`/`ended`/`previous_end`: `time.perf_counter()`;
        `applied`: an overlapped step's batch whose tokens it applied)."""
        decode, prefill_rows, prefill_tokens = _composition(batch)
        line: dict[str, object] = {
            "t": round(started - self._t0, 4),
            "pid": self._pid,
            "engine": engine,
            "ms": round((ended - started) * 1e3, 3),
            "gap_ms": None if previous_end is None else round((started - previous_end) * 1e3, 3),
            "rows": len(batch),
            "decode": decode,
            "prefill_rows": prefill_rows,
            "prefill_tokens": prefill_tokens,
            "running": len(scheduler.running),
            "waiting": sum(len(q) for q in scheduler.waiting.values()),
            "free_pages": scheduler.pages.num_free,
            "preempted": preempted,
            "waited_ms": round(waited_s * 1e3, 3),
        }
        if applied is not None:
            line["applied_decode"], _, line["applied_prefill_tokens"] = _composition(applied)
        self._file.write(json.dumps(line) + "\n")

    def flush(self) -> None:
        self._file.flush()


def _composition(batch: list[Scheduled]) -> tuple[int, int, int]:
    """(decode rows, prefill rows, prefill tokens) of a batch."""
    decode = prefill_rows = prefill_tokens = 0
    for item in batch:
        if item.start >= len(item.seq.prompt_ids):
            decode += 1
        else:
            prefill_rows += 1
            prefill_tokens += item.q_len
    return decode, prefill_rows, prefill_tokens


class EngineStepLog:
    """One engine's lines in its process's step log: what it saw at its previous line."""

    def __init__(self, log: StepLog) -> None:
        self.log = log
        self.number = log.engine_number()
        self.lines = 0
        # The batch the engine scheduled last (`Engine.begin_step` sets it).
        self.scheduled: list[Scheduled] = []
        self._previous_end: float | None = None
        self._preemptions = 0
        self._waited_s = 0.0

    @classmethod
    def from_env(cls) -> EngineStepLog | None:
        """A new engine's share of the log `NITSUM_STEP_LOG` names, or None (no log)."""
        log = StepLog.from_env()
        return cls(log) if log is not None else None

    def record(
        self,
        started: float,
        ended: float,
        batch: list[Scheduled],
        scheduler: Scheduler,
        waited_s: float = 0.0,
        applied: list[Scheduled] | None = None,
    ) -> None:
        """One step's line; `waited_s`: the engine's driver's cumulative waiting so far."""
        preemptions = scheduler.preemptions
        self.log.write(
            self.number,
            started,
            ended,
            self._previous_end,
            batch,
            scheduler,
            preemptions - self._preemptions,
            waited_s - self._waited_s,
            applied,
        )
        self._previous_end, self._preemptions, self._waited_s = ended, preemptions, waited_s
        self.lines += 1

    def driven(self, driver: StepDriver, scheduler: Scheduler) -> list[RequestOutput]:
        """`driver.step()`, logged: the batch it scheduled and the one it applied."""
        started, lines = time.perf_counter(), self.lines
        self.scheduled, driver.last_applied = [], []
        outputs = driver.step()
        if self.lines == lines:  # NOTE: a synchronous step logs itself (`Engine.end_step`)
            ended = time.perf_counter()
            self.record(
                started, ended, self.scheduled, scheduler, driver.waited_s, driver.last_applied
            )
        return outputs
