"""One trace per tier: workloads whose tiers belong to applications that peak at different times.

    TIER=TRACE[:scale=K][:offset=AT][:keep=F]

TRACE is anything `--trace` takes (azure-code, azure-conv, PATH.csv, PATH.jsonl). Each source
is read as a cycle over its own span (a day's pattern that repeats):

- `offset=AT` starts the cycle AT into the trace (a fraction of its span, `0.5`, or trace
  seconds, `1700s`) and wraps around, so the source keeps all its requests and its mean rate
  but its peaks move by AT;
- `scale=K` compresses the source's time axis K times (K times its rate, as `--rate-scale`
  does for the whole workload, which still applies on top);
- `keep=F` keeps each request with probability F (seeded): F times the rate, same pattern.

The composed workload spans the horizon given (e.g. `--duration`), by default the shortest
source cycle, so no request repeats; a longer horizon repeats shorter cycles. Arrivals are
merged in time order, each request tagged with its source's tier.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from nitsum.bench.timepoint import TimePoint, parse_time_point
from nitsum.bench.traces import TraceRequest, load_trace_file


@dataclass(frozen=True, slots=True)
class TierSource:
    """Where one tier's requests come from; see the module docstring for the fields."""

    tier: str
    trace: str
    scale: float = 1.0
    offset: TimePoint = TimePoint(0.0)
    keep: float = 1.0

    def __str__(self) -> str:
        return (
            f"{self.tier}={self.trace}:scale={self.scale:g}:offset={self.offset}:keep={self.keep:g}"
        )


def parse_tier_source(text: str) -> TierSource:
    """`strict=azure-code:scale=2:offset=0.5:keep=0.3`; `ValueError` says what is wrong."""
    tier, eq, rest = text.strip().partition("=")
    trace, *opts = rest.split(":")
    if not tier.strip() or not eq or not trace.strip():
        raise ValueError(
            f"tier source {text!r}: expected TIER=TRACE[:scale=K][:offset=AT][:keep=F]"
        )
    fields: dict[str, object] = {}
    for opt in opts:
        key, eq, val = (s.strip() for s in opt.partition("="))
        if not eq or key not in ("scale", "offset", "keep") or key in fields:
            raise ValueError(
                f"tier source {text!r}: bad option {opt!r} (scale=K, offset=AT, keep=F, once each)"
            )
        if key == "offset":
            fields[key] = parse_time_point(val, f"tier source {text!r} offset")
            continue
        try:
            num = float(val)
        except ValueError:
            raise ValueError(f"tier source {text!r}: {key} must be a number") from None
        if not math.isfinite(num) or num <= 0 or (key == "keep" and num > 1):
            bound = "in (0, 1]" if key == "keep" else "> 0"
            raise ValueError(f"tier source {text!r}: {key} must be {bound}, got {val}")
        fields[key] = num
    return TierSource(tier.strip(), trace.strip(), **fields)  # type: ignore[arg-type]


def cycle_period(reqs: Sequence[TraceRequest]) -> float:
    """The span a trace repeats over: last arrival plus one mean gap (so the wrap keeps the
    mean rate); 1 s for a trace of one request or with all arrivals at 0."""
    span = reqs[-1].arrival_s - reqs[0].arrival_s if reqs else 0.0
    return span * len(reqs) / (len(reqs) - 1) if len(reqs) > 1 and span > 0 else 1.0


def source_requests(
    reqs: Sequence[TraceRequest], src: TierSource, horizon_s: float, rng: random.Random
) -> list[TraceRequest]:
    """`reqs` (rebased to 0) as `src` shapes them, within [0, horizon_s), tagged `src.tier`."""
    period = cycle_period(reqs)
    off = src.offset.resolve(period) % period
    rotated = sorted((((r.arrival_s - off) % period, r) for r in reqs), key=lambda x: x[0])
    unit = period / src.scale
    out = []
    for k in range(math.ceil(horizon_s / unit)):
        for t, r in rotated:
            at = t / src.scale + k * unit
            if at >= horizon_s:
                break
            if src.keep < 1 and rng.random() >= src.keep:
                continue
            out.append(replace(r, arrival_s=at, tier=src.tier))
    return out


def compose_sources(
    sources: Sequence[TierSource],
    horizon_s: float | None = None,
    seed: int = 0,
    trace_dir: Path | None = None,
) -> tuple[list[TraceRequest], float]:
    """Merge the sources into one workload; returns (requests by arrival, horizon in seconds).

    Raises `TraceError` for a bad trace, `ValueError` for an empty trace or a bad horizon.
    """
    if not sources:
        raise ValueError("no tier sources given")
    if horizon_s is not None and horizon_s <= 0:
        raise ValueError(f"horizon must be > 0, got {horizon_s}")
    loaded: dict[str, list[TraceRequest]] = {}
    for src in sources:
        if src.trace not in loaded:
            reqs = load_trace_file(src.trace, trace_dir)
            if not reqs:
                raise ValueError(f"tier source {src.tier}: trace {src.trace} has no requests")
            loaded[src.trace] = reqs
    if horizon_s is None:
        horizon_s = min(cycle_period(loaded[s.trace]) / s.scale for s in sources)
    merged: list[tuple[float, int, TraceRequest]] = []
    for i, src in enumerate(sources):
        rng = random.Random(f"{seed}/{i}")
        merged += [
            (r.arrival_s, i, r) for r in source_requests(loaded[src.trace], src, horizon_s, rng)
        ]
    merged.sort(key=lambda x: (x[0], x[1]))
    return [r for _, _, r in merged], horizon_s
