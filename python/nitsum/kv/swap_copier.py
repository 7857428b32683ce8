"""A device's swap copies off the step path (FastSwitch §3.2, the Multithreading Swap Manager).

One thread per device runs the host tier's copies (`HostKVTier.swap`) in the order they were
started, while the device's own thread runs forwards: on CUDA the copies go on a copy stream
of their own, on CPU devices the thread's memcpy overlaps the forward's compute.

Each start carries a *ticket*, an id the controller takes from one increasing counter. The
copier reports the last ticket it finished (`SwapProgress.done_through`): copies run in start
order, so every ticket up to it is done.

NOTE (what keeps the copies from racing the forwards; the controller's side, engine/swap.py):
a page being read by a swap-out or written by a swap-in is never handed to a new owner before
its ticket is done, and a sequence whose swap-in is in flight is not scheduled. Host pages
need nothing more: one FIFO thread per device orders every write and read of them.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass

import torch

from nitsum.kv.host_tier import HostKVTier, PageCopies, SwapStats


@dataclass
class SwapProgress:
    """The last ticket finished (every earlier one is done too) and what the tickets finished
    since the previous report moved: bytes, copies (page runs), seconds copying."""

    done_through: int = 0
    bytes: int = 0
    copies: int = 0
    seconds: float = 0.0

    @staticmethod
    def of_group(parts: list[SwapProgress]) -> SwapProgress:
        """A group's progress from its members' (a ticket is done when every member did it;
        the members copy concurrently, so the time is the slowest member's)."""
        return SwapProgress(
            min(p.done_through for p in parts),
            sum(p.bytes for p in parts),
            sum(p.copies for p in parts),
            max(p.seconds for p in parts),
        )


@dataclass
class _Job:
    ticket: int
    out: PageCopies
    into: PageCopies
    # CUDA: the compute stream's point the copies must wait for (the pages' last writes).
    after: torch.cuda.Event | None = None


class SwapCopier:
    """The copy thread of one device's host tier."""

    def __init__(self, host: HostKVTier) -> None:
        self.host = host
        self.cuda = host.pool.storage.is_cuda
        self.stream = torch.cuda.Stream(host.pool.storage.device) if self.cuda else None
        self._jobs: deque[_Job] = deque()
        self._cv = threading.Condition()
        self._done_through = 0
        self._unreported = SwapProgress()
        self._error: BaseException | None = None
        self._closed = False
        self._busy = False  # a job is being copied (it stays first in `_jobs` until done)
        self._thread = threading.Thread(target=self._run, name="swap-copier", daemon=True)
        self._thread.start()

    def start(self, ticket: int, out: PageCopies, into: PageCopies) -> None:
        """Queue (device page, host page) copies `out`, then (host page, device page) copies
        `into`, under `ticket` (greater than every earlier one); returns at once."""
        after = None
        if self.cuda:
            after = torch.cuda.Event()
            after.record()  # the compute stream so far: the pages' KV is written by then
        with self._cv:
            if ticket <= max(self._done_through, self._jobs[-1].ticket if self._jobs else 0):
                raise ValueError(f"swap ticket {ticket} is not greater than the earlier ones")
            self._jobs.append(_Job(ticket, out, into, after))
            self._cv.notify_all()

    def progress(self, wait_for: int | None = None) -> SwapProgress:
        """What finished since the last report; with `wait_for`, first wait until that ticket
        (and so every earlier one) is done. Raises the error a copy raised, if any."""
        with self._cv:
            while wait_for is not None and self._done_through < wait_for and self._error is None:
                if not self._jobs and not self._busy:
                    raise ValueError(f"swap ticket {wait_for} was never started")
                self._cv.wait()
            if self._error is not None:
                raise RuntimeError(f"swap copy failed: {self._error!r}") from self._error
            report, self._unreported = self._unreported, SwapProgress()
            report.done_through = self._done_through
            return report

    def _run(self) -> None:
        torch.set_grad_enabled(False)
        while True:
            with self._cv:
                while not self._jobs and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                job = self._jobs[0]
                self._busy = True
            started = time.perf_counter()
            try:
                stats = self._copy(job)
            except BaseException as e:  # noqa: BLE001 - reported to the controller's next call
                with self._cv:
                    self._error, self._busy = e, False
                    self._cv.notify_all()
                return
            with self._cv:
                self._jobs.popleft()
                self._busy = False
                self._done_through = job.ticket
                r = self._unreported
                r.bytes += stats.bytes
                r.copies += stats.copies
                r.seconds += time.perf_counter() - started
                self._cv.notify_all()

    def _copy(self, job: _Job) -> SwapStats:
        if self.stream is None:
            return self.host.swap(job.out, job.into)
        with torch.cuda.stream(self.stream):
            if job.after is not None:
                self.stream.wait_event(job.after)
            return self.host.swap(job.out, job.into)  # synchronizes the copy stream

    def close(self) -> None:
        """Finish the queued copies, then stop the thread."""
        with self._cv:
            while (self._jobs or self._busy) and self._error is None:
                self._cv.wait()
            self._closed = True
            self._cv.notify_all()
        self._thread.join()
