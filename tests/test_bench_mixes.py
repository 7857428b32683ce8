"""Mix schedules (step, sine): parsing, shares per time bucket, determinism, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nitsum.bench.mixes import (
    SineSchedule,
    StepSchedule,
    assign_by_schedule,
    parse_mix,
    parse_mix_schedule,
    tier_shares,
)
from nitsum.bench.tiers import DEFAULT_TIERS
from nitsum.bench.timepoint import TimePoint
from nitsum.bench.traces import TraceRequest
from nitsum.bench.workload import WorkloadSpec, build_workload, run_requests


def uniform(n: int, span: float) -> list[TraceRequest]:
    """`n` requests evenly over [0, span); input_len is the index + 1."""
    return [TraceRequest(span * i / n, i + 1, 10) for i in range(n)]


def test_parse_mix_normalizes_and_fills_rest() -> None:
    assert parse_mix("a=1,b=3") == {"a": 0.25, "b": 0.75}
    assert parse_mix("a=0.3,b=rest,c=0.1") == pytest.approx({"a": 0.3, "b": 0.6, "c": 0.1})
    assert list(parse_mix("b=rest,a=0.5")) == ["b", "a"]  # order as written


def test_step_schedule_shares_per_bucket_follow_the_schedule() -> None:
    sched = parse_mix_schedule("step:strict=0.8,relaxed=0.2@0.5:strict=0.2,relaxed=0.8")
    assert isinstance(sched, StepSchedule)
    reqs = assign_by_schedule(uniform(20_000, 100.0), sched, 100.0, seed=3)
    shares = tier_shares(reqs, 100.0, 10)
    for i, bucket in enumerate(shares):
        want = 0.8 if i < 5 else 0.2
        assert bucket["strict"] == pytest.approx(want, abs=0.04), (i, bucket)
        assert bucket["strict"] + bucket["relaxed"] == pytest.approx(1.0)
    # The change is at 50 s exactly: every request before it saw the first mix.
    assert sched.shares_at(49.999, 100.0)["strict"] == 0.8
    assert sched.shares_at(50.0, 100.0)["strict"] == 0.2


def test_step_schedule_in_seconds_with_three_phases_and_background() -> None:
    sched = parse_mix_schedule("step:a=1@20s:b=1@0.6:a=1,background=rest")
    assert [sched.shares_at(t, 50.0) for t in (0, 19.9, 20, 29.9, 30)] == [
        {"a": 1.0},
        {"a": 1.0},
        {"b": 1.0},
        {"b": 1.0},
        {"a": 1.0, "background": 0.0},
    ]
    reqs = assign_by_schedule(uniform(100, 50.0), sched, 50.0)
    assert [r.tier for r in reqs] == ["a"] * 40 + ["b"] * 20 + ["a"] * 40


def test_sine_schedule_swings_one_tier_and_keeps_fixed_shares() -> None:
    sched = parse_mix_schedule("sine:strict=0.1..0.7,background=0.1,relaxed=rest")
    assert isinstance(sched, SineSchedule)
    assert sched.shares_at(0, 80.0) == pytest.approx(
        {"strict": 0.1, "background": 0.1, "relaxed": 0.8}
    )
    assert sched.shares_at(40, 80.0) == pytest.approx(
        {"strict": 0.7, "background": 0.1, "relaxed": 0.2}
    )
    reqs = assign_by_schedule(uniform(40_000, 80.0), sched, 80.0, seed=1)
    for i, bucket in enumerate(tier_shares(reqs, 80.0, 8)):
        mid = sched.shares_at((i + 0.5) * 10, 80.0)
        for tier in ("strict", "background", "relaxed"):
            assert bucket[tier] == pytest.approx(mid[tier], abs=0.04), (i, tier, bucket)
    quarter = parse_mix_schedule("sine:s=0..1,r=rest:period=0.5:phase=0.25")
    assert quarter.shares_at(0, 100.0)["s"] == pytest.approx(0.5)  # phase: a quarter cycle in
    assert quarter.shares_at(12.5, 100.0)["s"] == pytest.approx(1.0)  # period 50 s
    assert quarter.period == TimePoint(0.5)


def test_schedule_is_deterministic_given_the_seed() -> None:
    sched = parse_mix_schedule("sine:strict=0.2..0.8,relaxed=rest")
    reqs = uniform(500, 10.0)
    a = [r.tier for r in assign_by_schedule(reqs, sched, 10.0, seed=7)]
    assert a == [r.tier for r in assign_by_schedule(reqs, sched, 10.0, seed=7)]
    assert a != [r.tier for r in assign_by_schedule(reqs, sched, 10.0, seed=8)]


def test_workload_schedule_spans_the_window_and_survives_rate_scaling(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    rows = [{"timestamp": 0.1 * i, "input_length": 5, "output_length": 2} for i in range(1000)]
    trace.write_text("\n".join(json.dumps(r) for r in rows))
    spec = WorkloadSpec(
        trace=str(trace), start_s=20.0, duration_s=60.0, mix_schedule="step:strict=1@30s:relaxed=1"
    )
    w = build_workload(spec, list(DEFAULT_TIERS))
    assert w.nominal_s == 60.0
    tiers = [r.tier for r in w.requests]
    assert tiers == ["strict"] * 300 + ["relaxed"] * 300
    fast, duration = run_requests(w, 4.0, None)
    assert [r.tier for r in fast] == tiers
    assert duration == pytest.approx(15.0)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("wave:strict=1", "expected step:MIX@AT:MIX"),
        ("step:strict=x", "not a number"),
        ("step:strict=1,strict=2", "given twice"),
        ("step:strict=1@2:relaxed=1", "write 2s for seconds"),
        ("step:strict=1@0.7:relaxed=1@0.5:strict=1", "must increase"),
        ("step:strict=1@0.5relaxed=1", "expected @AT:MIX"),
        ("step:a=rest,b=rest", "only one tier may be 'rest'"),
        ("step:a=0.7,b=0.6,c=rest", "sum to 1.3 > 1"),
        ("sine:strict=0.1,relaxed=rest", "needs a range"),
        ("sine:strict=0.1..0.5", "exactly one tier that takes the rest"),
        ("sine:strict=0.5..0.2,relaxed=rest", "LO <= HI"),
        ("sine:strict=0.2..0.9,background=0.2,relaxed=rest", "exceed 1"),
        ("sine:strict=0.2..0.8,relaxed=rest:periods=1", "unknown option"),
        ("sine:strict=0.2..0.8,relaxed=rest:period=0", "period must be > 0"),
    ],
)
def test_bad_schedules_say_what_is_wrong(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_mix_schedule(spec)


def test_seconds_change_points_are_checked_against_the_span() -> None:
    sched = parse_mix_schedule("step:a=1@30s:b=1@0.5:a=1")
    assign_by_schedule(uniform(10, 100.0), sched, 100.0)  # 30 s < 50 s: fine
    with pytest.raises(ValueError, match="must increase"):
        assign_by_schedule(uniform(10, 40.0), sched, 40.0)  # 30 s > 20 s


def test_schedule_tiers_must_exist_and_exclude_other_rules() -> None:
    spec = WorkloadSpec(trace="bursty", mix_schedule="step:gold=1")
    with pytest.raises(ValueError, match="gold"):
        build_workload(spec, list(DEFAULT_TIERS))
    spec = WorkloadSpec(trace="bursty", mix_schedule="step:strict=1", tier_mix="strict=1")
    with pytest.raises(ValueError, match="one way to assign tiers"):
        build_workload(spec, list(DEFAULT_TIERS))
