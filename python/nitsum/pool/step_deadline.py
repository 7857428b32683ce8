"""How long a group's step may take before its devices count as hung.

A device process that stops (SIGSTOP, a wedged driver, a kernel that never returns) answers
no step: without a deadline the controller would wait on its pipe forever while the host
worker's heartbeats go on. A step's deadline is a floor plus `factor` times its expected
time; the expected time is a fit of the measured steps of that member set, a cost per step
plus a cost per token, kept as exponentially weighted sums (recent steps count most).

NOTE: the floor carries first steps, compiles and outliers; the fit only lets a long step
(a large prefill) have more than the floor.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

DEFAULT_FLOOR_S = 5.0  # `--device-step-timeout`'s default
FACTOR = 4.0
ALPHA = 0.1  # the weight of the newest step in the sums


@dataclass
class _Fit:
    """Exponentially weighted sums of (tokens x, seconds y) for a least-squares line."""

    w: float = 0.0
    x: float = 0.0
    y: float = 0.0
    xx: float = 0.0
    xy: float = 0.0

    def add(self, x: float, y: float) -> None:
        k = 1.0 - ALPHA
        self.w = k * self.w + ALPHA
        self.x = k * self.x + ALPHA * x
        self.y = k * self.y + ALPHA * y
        self.xx = k * self.xx + ALPHA * x * x
        self.xy = k * self.xy + ALPHA * x * y

    def expected(self, x: float) -> float:
        """Seconds for a step of `x` tokens: per step + per token, neither below 0."""
        if self.w == 0.0:
            return 0.0
        mx, my = self.x / self.w, self.y / self.w
        var = self.xx / self.w - mx * mx
        if var <= 1e-6 * max(1.0, mx * mx):
            # One size of step so far: a larger one takes at most proportionally longer.
            return my * max(1.0, x / mx) if mx > 0 else my
        per_token = max(0.0, (self.xy / self.w - mx * my) / var)
        return max(0.0, my - per_token * mx) + per_token * x


class StepDeadline:
    """Deadlines of steps per member set (a TP group, a pipeline, a device alone)."""

    def __init__(self, floor_s: float = DEFAULT_FLOOR_S, factor: float = FACTOR) -> None:
        if floor_s <= 0:
            raise ValueError(f"the device step timeout must be > 0, not {floor_s}")
        self.floor_s, self.factor = floor_s, factor
        self._fits: dict[tuple[int, ...], _Fit] = {}

    def observe(self, members: tuple[int, ...], tokens: int, seconds: float) -> None:
        """A step of `tokens` tokens on `members` took `seconds`."""
        self._fits.setdefault(members, _Fit()).add(float(tokens), seconds)

    def expected(self, members: tuple[int, ...], tokens: int) -> float:
        fit = self._fits.get(members)
        return fit.expected(float(tokens)) if fit is not None else 0.0

    def budget(self, members: tuple[int, ...], tokens: int) -> float:
        """Seconds a step of `tokens` tokens on `members` may take."""
        return self.floor_s + self.factor * self.expected(members, tokens)


def is_stopped(pid: int | None) -> bool:
    """True if process `pid` is stopped (SIGSTOP, a debugger): it answers nothing until
    resumed. False when unknown (no /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state in ("T", "t")


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds process `pid` has used (0.0 when unknown)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0
