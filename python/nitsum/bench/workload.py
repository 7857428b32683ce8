"""From a trace source to the requests of one run: load, window, lengths, tiers, rate, cap.

The order matters and is fixed here: tiers are assigned before rate scaling so every run of
a sweep replays the same requests with the same tiers, only faster or slower. The source is
one trace, or one trace per tier (`sources.py`); tiers come from a fixed mix, a length rule,
a mix schedule that changes over the run (`mixes.py`), or the per-tier sources themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from nitsum.bench.bursty import BurstySpec, generate_bursty
from nitsum.bench.mixes import assign_by_schedule, parse_mix_schedule
from nitsum.bench.random_dataset import RandomSpec, random_requests
from nitsum.bench.sources import compose_sources, parse_tier_source
from nitsum.bench.tiers import TierSpec, assign_by_length, assign_by_mix, fill_default_tier
from nitsum.bench.traces import TraceRequest, load_trace_file
from nitsum.bench.transform import limit, scale_lengths, scale_rate, slice_window


@dataclass(slots=True)
class WorkloadSpec:
    """Everything that shapes the requests, independent of the server."""

    trace: str  # azure-code | azure-conv | PATH.csv | PATH.jsonl | bursty | random
    start_s: float = 0.0
    duration_s: float | None = None
    input_scale: float = 1.0
    output_scale: float = 1.0
    max_context: int | None = None
    tier_mix: str | None = None
    tier_by_length: str | None = None
    default_tier: str | None = None
    seed: int = 0
    bursty: BurstySpec | None = None
    trace_dir: Path | None = None
    tier_sources: tuple[str, ...] = ()  # TIER=TRACE[:scale=K][:offset=AT][:keep=F]; no `trace`
    mix_schedule: str | None = None  # step:... | sine:... (mixes.py)
    random: RandomSpec | None = None  # `random`: the closed loop's requests (closed_loop.py)


@dataclass(slots=True)
class Workload:
    """Requests ready for rate scaling; `nominal_s` is the span they were cut from (window or
    generator duration), None when it is just the loaded trace's last arrival."""

    requests: list[TraceRequest]
    nominal_s: float | None


def build_workload(spec: WorkloadSpec, tiers: list[TierSpec]) -> Workload:
    """Load and shape the trace; every request ends with a tier named in `tiers`.

    Raises `TraceError` for a bad trace and `ValueError` for bad options or unknown tiers.
    """
    rules = [spec.tier_mix, spec.tier_by_length, spec.mix_schedule, spec.tier_sources]
    if sum(1 for x in rules if x) > 1:
        raise ValueError(
            "give one way to assign tiers: a tier mix, a length rule, a mix schedule or "
            "tier sources"
        )
    if spec.tier_sources:
        end = spec.start_s + spec.duration_s if spec.duration_s is not None else None
        sources = [parse_tier_source(s) for s in spec.tier_sources]
        reqs, nominal = compose_sources(sources, end, spec.seed, spec.trace_dir)
    elif spec.trace == "random":
        reqs, nominal = random_requests(spec.random or RandomSpec()), None
    elif spec.trace == "bursty":
        bspec = spec.bursty or BurstySpec(seed=spec.seed)
        reqs, nominal = generate_bursty(bspec), bspec.duration_s
    else:
        reqs, nominal = load_trace_file(spec.trace, spec.trace_dir), None
    if spec.start_s or spec.duration_s is not None:
        reqs = slice_window(reqs, spec.start_s, spec.duration_s)
        if spec.duration_s is not None:
            nominal = spec.duration_s
        elif nominal is not None:
            nominal = max(nominal - spec.start_s, 0.0) or None
    reqs = scale_lengths(reqs, spec.input_scale, spec.output_scale, spec.max_context)
    if spec.tier_mix:
        reqs = assign_by_mix(reqs, spec.tier_mix, spec.seed)
    elif spec.tier_by_length:
        reqs = assign_by_length(reqs, spec.tier_by_length)
    elif spec.mix_schedule:
        span = nominal or max((r.arrival_s for r in reqs), default=0.0) or 1.0
        reqs = assign_by_schedule(reqs, parse_mix_schedule(spec.mix_schedule), span, spec.seed)
    names = [t.name for t in tiers]
    default = spec.default_tier or next((t.name for t in tiers if not t.background), names[0])
    reqs = fill_default_tier(reqs, default)
    unknown = sorted({r.tier for r in reqs if r.tier not in names})  # type: ignore[type-var]
    if unknown:
        raise ValueError(f"requests have tier(s) {unknown} not in the tiers spec {names}")
    return Workload(reqs, nominal)


def run_requests(
    w: Workload, rate_scale: float, max_requests: int | None
) -> tuple[list[TraceRequest], float | None]:
    """The requests of one run at `rate_scale` and the trace duration for its goodput.

    Duration: when the cap cuts the trace, the arrival of the first request left out (the
    kept requests came from that span); else the nominal span, else the last arrival; all
    divided by the rate scale. None when that is 0 (e.g. a single request): use wall time.
    """
    scaled = scale_rate(w.requests, rate_scale)
    kept = limit(scaled, max_requests)
    if len(kept) < len(scaled):
        duration = scaled[len(kept)].arrival_s
    elif w.nominal_s is not None:
        duration = w.nominal_s / rate_scale
    else:
        duration = max((r.arrival_s for r in kept), default=0.0)
    return kept, (duration if duration > 0 else None)
