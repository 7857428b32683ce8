"""The host KV tier as a local scheduler sees it: host page ids and what a swap costs.

A preempted sequence either drops its KV and recomputes it later, or has it copied to host
pages and back (FastSwitch §3). Which one is cheaper depends on its length: recomputing costs
about its tokens / budget full steps, a swap two copies of its pages. The copy speed is
measured on every swap (`observe`), the step time by the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass

from nitsum.kv.pages import GroupPages

# Copy speed assumed until the first swap is timed (bytes/s; a modest host memcpy).
DEFAULT_BYTES_PER_S = 2e9


@dataclass
class SwapSpace:
    """Host pages mirrored on a group's members (`host`), the bytes one page of one device
    holds (all layers, K and V) and the measured copy speed."""

    host: GroupPages
    page_bytes: int
    bytes_per_s: float = DEFAULT_BYTES_PER_S

    def seconds(self, pages: int) -> float:
        """Estimated time of one copy of `pages` pages (one direction)."""
        return pages * self.page_bytes / self.bytes_per_s

    def observe(self, nbytes: int, seconds: float) -> None:
        """Fold a timed swap into the speed estimate (exponential average)."""
        if nbytes > 0 and seconds > 0:
            self.bytes_per_s = 0.7 * self.bytes_per_s + 0.3 * (nbytes / seconds)
