"""A point in time given as a fraction of a span (`0.5`) or in seconds (`1800s`).

Mix schedules and per-tier sources (`mixes.py`, `sources.py`) place their changes this way,
so a schedule written as fractions fits any run length and rate scale.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TimePoint:
    """`value` seconds when `seconds`, else `value` (in [0, 1]) times the span."""

    value: float
    seconds: bool = False

    def resolve(self, span_s: float) -> float:
        """The point in seconds within a span of `span_s` seconds."""
        return self.value if self.seconds else self.value * span_s

    def __str__(self) -> str:
        return f"{self.value:g}s" if self.seconds else f"{self.value:g}"


def parse_time_point(text: str, what: str) -> TimePoint:
    """`"0.5"` → half of the span, `"1800s"` → 1800 seconds; `what` names the field in errors."""
    raw = text.strip()
    seconds = raw.endswith("s")
    try:
        value = float(raw[:-1] if seconds else raw)
    except ValueError:
        raise ValueError(
            f"{what}: expected a fraction of the run (e.g. 0.5) or seconds (e.g. 1800s), "
            f"got {text!r}"
        ) from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{what}: must be a finite number >= 0, got {text!r}")
    if not seconds and value > 1:
        raise ValueError(
            f"{what}: {text!r} is read as a fraction of the run and must be <= 1; "
            f"write {value:g}s for seconds"
        )
    return TimePoint(value, seconds)
