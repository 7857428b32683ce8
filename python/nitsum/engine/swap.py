"""The host KV tier as a local scheduler sees it: host page ids and what a swap costs.

A preempted sequence either drops its KV and recomputes it later, or has it copied to host
pages and back (FastSwitch §3). Which one is cheaper depends on its length: recomputing costs
about its tokens / budget full steps, a swap two copies of its pages. The copy speed is
measured on every swap (`observe`), the step time by the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nitsum.kv.pages import GroupPages

# Copy speed assumed until the first swap is timed (bytes/s; a modest host memcpy).
DEFAULT_BYTES_PER_S = 2e9


@dataclass
class SwapSpace:
    """Host pages mirrored on a group's members (`host`), the bytes one page of one device
    holds (all layers, K and V), the measured copy speed, and the copies the scheduler
    planned for its next step: (device page, host page) `out`, then (host page, device page)
    `into`, and host pages to free once they ran (`done`)."""

    host: GroupPages
    page_bytes: int
    bytes_per_s: float = DEFAULT_BYTES_PER_S
    out: list[tuple[int, int]] = field(default_factory=list)
    into: list[tuple[int, int]] = field(default_factory=list)
    done: list[int] = field(default_factory=list)

    def swap_out(self, device_pages: list[int]) -> list[int]:
        """Host pages for `device_pages`, copied out before the next forward."""
        host_pages = self.host.allocate(len(device_pages))
        self.out += zip(device_pages, host_pages, strict=True)
        return host_pages

    def swap_in(self, host_pages: list[int], device_pages: list[int]) -> None:
        """Copy `host_pages` back into `device_pages` before the next forward."""
        self.into += zip(host_pages, device_pages, strict=True)

    def free_after_copies(self, host_pages: list[int]) -> None:
        """Free `host_pages` once the planned copies ran (a swap-in may still read them)."""
        self.done += host_pages

    def take(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """The planned copies, out then in; the caller runs them, then `copied`."""
        out, into = self.out, self.into
        self.out, self.into = [], []
        return out, into

    def copied(self, nbytes: int, seconds: float) -> None:
        """The copies ran: free the host pages they read, fold in their timing."""
        self.host.release(self.done)
        self.done = []
        self.observe(nbytes, seconds)

    def seconds(self, pages: int) -> float:
        """Estimated time of one copy of `pages` pages (one direction)."""
        return pages * self.page_bytes / self.bytes_per_s

    def observe(self, nbytes: int, seconds: float) -> None:
        """Fold a timed swap into the speed estimate (exponential average)."""
        if nbytes > 0 and seconds > 0:
            self.bytes_per_s = 0.7 * self.bytes_per_s + 0.3 * (nbytes / seconds)
