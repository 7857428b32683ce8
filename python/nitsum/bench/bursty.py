"""Synthetic bursty workload: a Poisson process whose rate alternates between low and high.

Modeled on Flying Serving §6.1.3: arrivals alternate between a low load (2–5 req/s) and high
load bursts (10–30 req/s); prompts uniform in [128, 4000] tokens, outputs in [64, 512].
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from nitsum.bench.traces import TraceRequest


@dataclass(frozen=True, slots=True)
class UniformLengths:
    """Token counts drawn uniformly from the integers `lo..hi` (inclusive)."""

    lo: int
    hi: int

    def __post_init__(self) -> None:
        if not 1 <= self.lo <= self.hi:
            raise ValueError(f"need 1 <= lo <= hi, got {self.lo}..{self.hi}")

    @classmethod
    def parse(cls, text: str) -> UniformLengths:
        """`"128:4000"` → uniform 128..4000; `"256"` → always 256."""
        lo, _, hi = text.partition(":")
        return cls(int(lo), int(hi or lo))

    def sample(self, rng: random.Random) -> int:
        return rng.randint(self.lo, self.hi)


@dataclass(frozen=True, slots=True)
class BurstySpec:
    """Parameters of the bursty generator.

    Each period of `period_s` seconds starts with a low phase at `low_rate` req/s lasting
    `(1 - burst_fraction) * period_s`, followed by a high phase at `high_rate` req/s.
    """

    low_rate: float = 3.0
    high_rate: float = 20.0
    period_s: float = 20.0
    duration_s: float = 120.0
    burst_fraction: float = 0.5
    input_lens: UniformLengths = UniformLengths(128, 4000)
    output_lens: UniformLengths = UniformLengths(64, 512)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.low_rate < 0 or self.high_rate < 0:
            raise ValueError("rates must be >= 0")
        if self.period_s <= 0 or self.duration_s <= 0:
            raise ValueError("period_s and duration_s must be > 0")
        if not 0.0 <= self.burst_fraction <= 1.0:
            raise ValueError("burst_fraction must be in [0, 1]")

    def phases(self) -> list[tuple[float, float, float]]:
        """The piecewise-constant rate as `(start_s, end_s, rate)` pieces covering the duration."""
        low_len = (1.0 - self.burst_fraction) * self.period_s
        out: list[tuple[float, float, float]] = []
        t = 0.0
        while t < self.duration_s:
            for length, rate in (
                (low_len, self.low_rate),
                (self.period_s - low_len, self.high_rate),
            ):
                end = min(t + length, self.duration_s)
                if end > t:
                    out.append((t, end, rate))
                t += length
                if t >= self.duration_s:
                    break
        return out


def generate_bursty(spec: BurstySpec) -> list[TraceRequest]:
    """Arrivals of the piecewise Poisson process described by `spec`, seeded and reproducible.

    Within each phase inter-arrival gaps are exponential with the phase's rate; at a phase
    boundary the draw restarts, which is exact because the exponential is memoryless. The
    number of arrivals in a phase is therefore Poisson(rate × phase length).

    NOTE: unlike loaded traces, the first arrival is generally not at 0: the trace starts at 0
    and lasts `duration_s`, so rates stay exact.
    """
    rng = random.Random(spec.seed)
    out: list[TraceRequest] = []
    for start, end, rate in spec.phases():
        if rate <= 0:
            continue
        t = start + rng.expovariate(rate)
        while t < end:
            out.append(TraceRequest(t, spec.input_lens.sample(rng), spec.output_lens.sample(rng)))
            t += rng.expovariate(rate)
    return out
