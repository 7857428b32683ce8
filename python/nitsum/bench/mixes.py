"""Tier mixes that change over a run: a step schedule and a sinusoidal ("diurnal") one.

    step:MIX[@AT:MIX]...
        MIX until the first AT, then the next MIX, and so on. E.g.
        `step:strict=0.8,relaxed=0.2@0.5:strict=0.2,relaxed=0.8` (strict-heavy first half).
    sine:TIER=LO..HI,OTHER=SHARE|rest,...[:period=AT][:phase=F]
        TIER's share swings between LO and HI: LO + (HI - LO) * (1 - cos 2π(t/period + phase)) / 2,
        so with phase 0 it is LO at the start and HI half a period later. The other tiers keep
        fixed shares; the one written `rest` takes what is left. `period` defaults to the
        whole run (one cycle: a day compressed into the run). E.g.
        `sine:strict=0.1..0.8,background=0.1,relaxed=rest`.

MIX is `tier=weight,...` as for `--mix` (weights are normalized); one tier may say `rest` (1
minus the others, which are then shares that must not exceed 1). AT is a fraction of the run
(`0.5`) or seconds of the workload before rate scaling (`1800s`).

Each request draws its tier from the shares at its arrival time with a seeded RNG, so the
result is deterministic given the seed and unchanged by later rate scaling.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace

from nitsum.bench.timepoint import TimePoint, parse_time_point
from nitsum.bench.traces import TraceRequest

Mix = dict[str, float]  # tier -> probability (sums to 1), in the order written


def parse_mix(text: str, what: str = "mix") -> Mix:
    """`strict=0.3,relaxed=0.7` (normalized) or `strict=0.3,background=0.1,relaxed=rest`."""
    mix: dict[str, float | None] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, eq, val = (s.strip() for s in item.partition("="))
        if not name or not eq:
            raise ValueError(f"{what} {text!r}: expected TIER=WEIGHT, got {item!r}")
        if name in mix:
            raise ValueError(f"{what} {text!r}: tier {name!r} given twice")
        if val == "rest":
            mix[name] = None
            continue
        try:
            w = float(val)
        except ValueError:
            raise ValueError(f"{what} {text!r}: weight of {name!r} is not a number") from None
        if not math.isfinite(w) or w < 0:
            raise ValueError(f"{what} {text!r}: weight of {name!r} must be >= 0")
        mix[name] = w
    rest = [n for n, w in mix.items() if w is None]
    fixed = sum(w for w in mix.values() if w is not None)
    if len(rest) > 1:
        raise ValueError(f"{what} {text!r}: only one tier may be 'rest', got {rest}")
    if rest:
        if fixed > 1 + 1e-9:
            raise ValueError(f"{what} {text!r}: shares besides 'rest' sum to {fixed:g} > 1")
        return {n: (max(0.0, 1 - fixed) if w is None else w) for n, w in mix.items()}
    if fixed <= 0:
        raise ValueError(f"{what} {text!r}: needs a positive weight")
    return {n: w / fixed for n, w in mix.items() if w is not None}


@dataclass(frozen=True, slots=True)
class StepSchedule:
    """Piecewise-constant mixes: `phases[i]` holds from its time until the next one's."""

    phases: tuple[tuple[TimePoint, Mix], ...]

    @property
    def tiers(self) -> list[str]:
        return list(dict.fromkeys(n for _, mix in self.phases for n in mix))

    def shares_at(self, t_s: float, span_s: float) -> Mix:
        """The mix in force at `t_s` seconds of a run `span_s` long."""
        current = self.phases[0][1]
        for at, mix in self.phases[1:]:
            if t_s < at.resolve(span_s):
                break
            current = mix
        return current

    def check(self, span_s: float) -> None:
        """Raise if the change points do not increase within `span_s` (units may mix)."""
        times = [at.resolve(span_s) for at, _ in self.phases]
        if any(b <= a for a, b in zip(times, times[1:], strict=False)):
            shown = ", ".join(str(at) for at, _ in self.phases[1:])
            raise ValueError(f"step schedule: change points must increase, got {shown}")


@dataclass(frozen=True, slots=True)
class SineSchedule:
    """`tier`'s share follows a raised cosine between `lo` and `hi`; `fixed` tiers keep their
    shares and `rest` takes the remainder."""

    tier: str
    lo: float
    hi: float
    fixed: tuple[tuple[str, float], ...]
    rest: str
    period: TimePoint = TimePoint(1.0)
    phase: float = 0.0

    @property
    def tiers(self) -> list[str]:
        return [self.tier, *(n for n, _ in self.fixed), self.rest]

    def shares_at(self, t_s: float, span_s: float) -> Mix:
        """The mix at `t_s` seconds of a run `span_s` long."""
        period = self.period.resolve(span_s) or 1.0
        x = (1 - math.cos(2 * math.pi * (t_s / period + self.phase))) / 2
        share = self.lo + (self.hi - self.lo) * x
        mix = {self.tier: share, **dict(self.fixed)}
        mix[self.rest] = max(0.0, 1 - sum(mix.values()))
        return mix

    def check(self, span_s: float) -> None:
        if self.period.resolve(span_s) <= 0:
            raise ValueError("sine schedule: period must be > 0")


MixSchedule = StepSchedule | SineSchedule


def _parse_step(body: str) -> StepSchedule:
    parts = body.split("@")
    phases = [(TimePoint(0.0), parse_mix(parts[0], "step schedule mix"))]
    for part in parts[1:]:
        at, colon, mix = part.partition(":")
        if not colon:
            raise ValueError(f"step schedule: expected @AT:MIX, got @{part!r}")
        phases.append((parse_time_point(at, "step schedule change point"), parse_mix(mix)))
    schedule = StepSchedule(tuple(phases))
    if all(not at.seconds for at, _ in phases[1:]):
        schedule.check(1.0)
    return schedule


def _parse_sine(body: str) -> SineSchedule:
    shares, *opts = body.split(":")
    swing: tuple[str, float, float] | None = None
    fixed: list[tuple[str, float]] = []
    rest: list[str] = []
    for item in filter(None, (p.strip() for p in shares.split(","))):
        name, eq, val = (s.strip() for s in item.partition("="))
        if not name or not eq:
            raise ValueError(f"sine schedule: expected TIER=SHARE, got {item!r}")
        if ".." in val:
            lo_text, _, hi_text = val.partition("..")
            if swing is not None:
                raise ValueError(f"sine schedule: only one tier swings, got {item!r} too")
            try:
                swing = (name, float(lo_text), float(hi_text))
            except ValueError:
                raise ValueError(f"sine schedule: bad range {val!r} (want LO..HI)") from None
        elif val == "rest":
            rest.append(name)
        else:
            try:
                share = float(val)
            except ValueError:
                raise ValueError(
                    f"sine schedule: share of {name!r} must be a number, LO..HI or rest"
                ) from None
            if not 0 <= share <= 1:
                raise ValueError(f"sine schedule: share of {name!r} must be in [0, 1]")
            fixed.append((name, share))
    if swing is None:
        raise ValueError("sine schedule: one tier needs a range, e.g. strict=0.2..0.8")
    name, lo, hi = swing
    if len(rest) != 1:
        raise ValueError(
            "sine schedule: name exactly one tier that takes the rest, e.g. relaxed=rest"
        )
    if not 0 <= lo <= hi <= 1:
        raise ValueError(f"sine schedule: need 0 <= LO <= HI <= 1, got {lo:g}..{hi:g}")
    if hi + sum(w for _, w in fixed) > 1 + 1e-9:
        raise ValueError("sine schedule: HI plus the fixed shares exceed 1")
    names = [name, *(n for n, _ in fixed), rest[0]]
    if len(set(names)) != len(names):
        raise ValueError(f"sine schedule: a tier is named twice in {names}")
    period, phase = TimePoint(1.0), 0.0
    for opt in opts:
        key, eq, val = (s.strip() for s in opt.partition("="))
        if key == "period" and eq:
            period = parse_time_point(val, "sine schedule period")
        elif key == "phase" and eq:
            phase = float(val)
        else:
            raise ValueError(f"sine schedule: unknown option {opt!r} (period=AT, phase=F)")
    schedule = SineSchedule(name, lo, hi, tuple(fixed), rest[0], period, phase)
    schedule.check(1.0)
    return schedule


def parse_mix_schedule(text: str) -> MixSchedule:
    """`step:...` or `sine:...` (see the module docstring); `ValueError` says what is wrong."""
    kind, colon, body = text.strip().partition(":")
    if kind == "step" and colon:
        return _parse_step(body)
    if kind == "sine" and colon:
        return _parse_sine(body)
    raise ValueError(f"mix schedule {text!r}: expected step:MIX@AT:MIX... or sine:TIER=LO..HI,...")


def assign_by_schedule(
    reqs: list[TraceRequest], schedule: MixSchedule, span_s: float, seed: int = 0
) -> list[TraceRequest]:
    """Give every request a tier drawn from `schedule` at its arrival (a run of `span_s` s)."""
    schedule.check(span_s)
    rng = random.Random(seed)
    out = []
    for r in reqs:
        shares = schedule.shares_at(r.arrival_s, span_s)
        u, acc, tier = rng.random(), 0.0, None
        for name, p in shares.items():
            if p > 0:
                tier, acc = name, acc + p
                if u < acc:
                    break
        out.append(replace(r, tier=tier))
    return out


def tier_shares(reqs: list[TraceRequest], span_s: float, buckets: int) -> list[dict[str, float]]:
    """Share of each tier among the arrivals of each of `buckets` equal slices of the span
    (an empty slice gives {})."""
    counts: list[dict[str, int]] = [{} for _ in range(buckets)]
    for r in reqs:
        i = min(max(int(r.arrival_s / span_s * buckets), 0), buckets - 1)
        counts[i][str(r.tier)] = counts[i].get(str(r.tier), 0) + 1
    return [{k: v / sum(c.values()) for k, v in c.items()} for c in counts]
