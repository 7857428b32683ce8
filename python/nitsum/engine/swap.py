"""The swap manager of one TP group: host pages, copy tickets and what a swap costs
(FastSwitch §3.2).

A preempted sequence either drops its KV and recomputes it later, or has it copied to host
pages and back. Which one is cheaper depends on its length: recomputing costs about its
tokens / budget full steps, a swap two copies of its pages. The copy speed is measured on
every ticket, the step time by the scheduler.

The scheduler plans copies while it builds a step (`swap_out`, `swap_in`); the engine starts
them as one *ticket* on the group's copy threads (`submit`, kv/swap_copier.py) and learns
which tickets finished before the next step (`poll`). A swap-in runs either

- asynchronously: its sequence waits (`Sequence.loading`) while the rest of the batch runs,
  and joins the batch once the ticket is done; or
- synchronously: its sequence is in this very step, which waits for the copy. That is
  cheaper when the copy is short next to a step shared by many sequences (`sync_is_cheaper`).

NOTE (conflicts between copies in flight and new allocations): the device pages a ticket
reads (swap-out) or writes (swap-in) are *held* on the allocator until it is done, so no new
owner gets them meanwhile; an allocation that cannot do without held pages waits for the
copies (`settle`). A sequence leaving while its swap-in is in flight waits for it (`wait`).
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from nitsum.engine.sequence import Sequence
from nitsum.kv.host_tier import PageCopies
from nitsum.kv.pages import GroupPages
from nitsum.kv.swap_copier import SwapProgress

# Copy speed assumed until the first ticket is timed (bytes/s per device; a modest memcpy).
DEFAULT_BYTES_PER_S = 2e9
# NOTE: one counter for every group of the process, so the tickets a device gets always
# increase, across reconfigurations too (the copier reports progress as "done through").
_TICKETS = itertools.count(1)
SWAP_MODES = ("auto", "sync", "async")
COUNTERS = ("swap_out_pages", "swap_in_pages", "swap_bytes", "swap_copies", "swap_waits")


class Copier(Protocol):
    """The group's copy threads (an engine's runner)."""

    def start_swap(self, ticket: int, out: PageCopies, into: PageCopies) -> None: ...

    def swap_progress(self, wait_for: int | None = None) -> SwapProgress: ...


@dataclass
class Ticket:
    """Copies in flight: the device pages they hold and the sequences they load."""

    id: int
    device_pages: list[int]
    loading: list[Sequence]


@dataclass
class SwapSpace:
    """Host pages mirrored on a group's members (`host`), the group's device pages
    (`device`), the bytes one page of one device holds (all layers, K and V) and the measured
    copy speed. `mode`: "auto" (swap-ins asynchronous unless `sync_is_cheaper`), "sync" or
    "async" (tests, benchmarks)."""

    host: GroupPages
    device: GroupPages
    page_bytes: int
    mode: str = "auto"
    bytes_per_s: float = DEFAULT_BYTES_PER_S
    copier: Copier | None = None
    # Planned for the next ticket: (device, host) copies out, then (host, device) copies in,
    # the device pages they touch, the sequences loading, host pages to free once started,
    # and whether the step waits for the ticket.
    out: PageCopies = field(default_factory=list)
    into: PageCopies = field(default_factory=list)
    held: list[int] = field(default_factory=list)
    loading: list[Sequence] = field(default_factory=list)
    release: list[int] = field(default_factory=list)
    wait_now: bool = False
    inflight: deque[Ticket] = field(default_factory=deque)
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))

    def __post_init__(self) -> None:
        if self.mode not in SWAP_MODES:
            raise ValueError(f"swap mode must be one of {SWAP_MODES}, got {self.mode!r}")
        self.device.settle = self.settle

    # -- planning (the scheduler, while it builds a step) --------------------------------------
    def swap_out(self, device_pages: list[int]) -> list[int]:
        """Host pages for `device_pages`, copied out by the next ticket (the device pages are
        held until then, so they can be released at once).

        NOTE: within a ticket copies out run first; a page the planned ticket copies *into*
        (a swap-in or a prefix load of this very pass) must be read after that copy, so the
        planned ticket starts first and this copy goes in the next one (FIFO after it)."""
        if not {d for _, d in self.into}.isdisjoint(device_pages):
            self.submit()
        host_pages = self.host.allocate(len(device_pages))
        self.out += zip(device_pages, host_pages, strict=True)
        self._hold(device_pages)
        return host_pages

    def swap_in(
        self, seq: Sequence | None, host_pages: list[int], device_pages: list[int], sync: bool
    ) -> None:
        """Copy `host_pages` back into `device_pages` (`seq`'s own); with `sync` this step
        waits for the copy, else `seq` waits (`loading`) until its ticket is done."""
        self.into += zip(host_pages, device_pages, strict=True)
        self._hold(device_pages)
        if sync:
            self.wait_now = True
        else:
            assert seq is not None, "an asynchronous swap-in loads a sequence"
            seq.loading = True
            self.loading.append(seq)

    def load(self, host_page: int, device_page: int) -> None:
        """Copy a cached prefix page from host back into `device_page` before this step's
        forward (a sequence of this step reads it), then free the host page."""
        self.swap_in(None, [host_page], [device_page], sync=True)
        self.free_after_start([host_page])

    def free_after_start(self, host_pages: list[int]) -> None:
        """Free `host_pages` once the next ticket has started.

        NOTE: not sooner: within a ticket, copies out run before copies in, so a host page
        read by a swap-in must not take a swap-out of the same ticket. Later tickets run after
        it on every device (one FIFO copy thread each), so they may reuse it.
        """
        self.release += host_pages

    def _hold(self, pages: list[int]) -> None:
        self.device.hold(pages)
        self.held += pages

    # -- running (the engine, around the forward) ----------------------------------------------
    def submit(self) -> None:
        """Start the planned copies as one ticket; wait for it if a swap-in of this step's
        batch needs it."""
        if self.out or self.into:
            assert self.copier is not None, "a swap space needs its group's copier"
            ticket = Ticket(next(_TICKETS), self.held, self.loading)
            self.copier.start_swap(ticket.id, self.out, self.into)
            self.inflight.append(ticket)
            self.counters["swap_out_pages"] += len(self.out)
            self.counters["swap_in_pages"] += len(self.into)
        self.host.release(self.release)
        wait = self.wait_now and bool(self.inflight)
        self.out, self.into, self.held, self.loading, self.release = [], [], [], [], []
        self.wait_now = False
        if wait:
            self.poll(self.inflight[-1].id)

    def poll(self, wait_for: int | None = None) -> None:
        """Retire the tickets done (release their pages, their sequences may run); with
        `wait_for`, wait for that ticket first."""
        if not self.inflight:
            return
        assert self.copier is not None
        if wait_for is not None:
            self.counters["swap_waits"] += 1
        progress = self.copier.swap_progress(wait_for)
        while self.inflight and self.inflight[0].id <= progress.done_through:
            ticket = self.inflight.popleft()
            self.device.unhold(ticket.device_pages)
            for seq in ticket.loading:
                seq.loading = False
        self.counters["swap_bytes"] += progress.bytes
        self.counters["swap_copies"] += progress.copies
        self.observe(progress.bytes // max(1, self.device.tp), progress.seconds)

    def settle(self) -> None:
        """Start what is planned and wait for every ticket in flight."""
        self.submit()
        if self.inflight:
            self.poll(self.inflight[-1].id)

    def wait(self, seq: Sequence) -> None:
        """Wait until `seq`'s swap-in is done (it is leaving or being preempted)."""
        if seq in self.loading:  # planned, not started: start it with the rest
            self.submit()
        for ticket in self.inflight:
            if seq in ticket.loading:
                self.poll(ticket.id)
                return

    def wait_loading(self) -> None:
        """Wait for the first ticket in flight that loads a sequence, if any."""
        for ticket in self.inflight:
            if ticket.loading:
                self.poll(ticket.id)
                return

    # -- costs ----------------------------------------------------------------------------------
    def seconds(self, pages: int) -> float:
        """Estimated time of one copy of `pages` pages (one direction)."""
        return pages * self.page_bytes / self.bytes_per_s

    def sync_is_cheaper(self, pages: int, others: int, step_s: float | None) -> bool:
        """Swap `pages` in synchronously rather than asynchronously, with `others` sequences
        in the step and steps of about `step_s` seconds.

        NOTE: a synchronous copy delays every other sequence of the step by its time, an
        asynchronous one delays its own sequence by about a step (it joins the next one): sync
        when others × copy time ≤ one step (FastSwitch's adaptive swapping: many short
        requests swap in synchronously).
        """
        if self.mode != "auto":
            return self.mode == "sync"
        if others == 0 or step_s is None:
            return True
        return others * self.seconds(pages) <= step_s

    def observe(self, nbytes: int, seconds: float) -> None:
        """Fold a timed copy into the speed estimate (exponential average)."""
        if nbytes > 0 and seconds > 0:
            self.bytes_per_s = 0.7 * self.bytes_per_s + 0.3 * (nbytes / seconds)
