"""Per-tier sources: each tier keeps its own trace's arrival pattern, offset and scale."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nitsum.bench.bench_cli import main as bench_main
from nitsum.bench.sources import TierSource, compose_sources, parse_tier_source
from nitsum.bench.tiers import DEFAULT_TIERS, load_tiers_file
from nitsum.bench.timepoint import TimePoint
from nitsum.bench.workload import WorkloadSpec, build_workload


def jsonl(tmp_path: Path, name: str, arrivals: list[float]) -> str:
    """A JSONL trace; request i has input_length i + 1 (to follow it through the shaping)."""
    path = tmp_path / name
    rows = [
        {"timestamp": t, "input_length": i + 1, "output_length": 3} for i, t in enumerate(arrivals)
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return str(path)


def test_parse_tier_source() -> None:
    src = parse_tier_source("strict=azure-code:scale=2:offset=0.5:keep=0.3")
    assert src == TierSource("strict", "azure-code", 2.0, TimePoint(0.5), 0.3)
    assert parse_tier_source("bg=x.csv:offset=120s").offset == TimePoint(120.0, seconds=True)
    assert parse_tier_source("relaxed=azure-conv") == TierSource("relaxed", "azure-conv")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("strict", "expected TIER=TRACE"),
        ("strict=", "expected TIER=TRACE"),
        ("=azure-code", "expected TIER=TRACE"),
        ("strict=azure-code:speed=2", "bad option 'speed=2'"),
        ("strict=azure-code:scale=2:scale=3", "once each"),
        ("strict=azure-code:scale=0", "scale must be > 0"),
        ("strict=azure-code:keep=1.5", r"keep must be in \(0, 1\]"),
        ("strict=azure-code:scale=fast", "scale must be a number"),
        ("strict=azure-code:offset=2", "write 2s for seconds"),
    ],
)
def test_bad_tier_sources_say_what_is_wrong(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_tier_source(spec)


def test_offset_rotates_and_scale_compresses_the_source(tmp_path: Path) -> None:
    # 10 requests every 10 s: the cycle is 100 s (last arrival + one mean gap).
    a = jsonl(tmp_path, "a.jsonl", [10.0 * i for i in range(10)])
    src = parse_tier_source(f"strict={a}:scale=2:offset=0.25")
    reqs, horizon = compose_sources([src])
    assert horizon == pytest.approx(50.0)
    # Started 25 s in: the request at 30 s comes first (at 5 s), then the cycle wraps.
    assert [r.arrival_s for r in reqs] == pytest.approx([2.5 + 5 * i for i in range(10)])
    assert [r.input_len for r in reqs] == [4, 5, 6, 7, 8, 9, 10, 1, 2, 3]
    assert {r.tier for r in reqs} == {"strict"}


def test_each_tier_keeps_its_own_pattern(tmp_path: Path) -> None:
    burst = jsonl(tmp_path, "burst.jsonl", [0.01 * i for i in range(50)] + [99.0])  # 0-0.5 s, 99 s
    steady = jsonl(tmp_path, "steady.jsonl", [float(i) for i in range(100)])
    sources = [f"strict={burst}:offset=50s", f"relaxed={steady}"]
    spec = WorkloadSpec(trace="", tier_sources=tuple(sources))
    w = build_workload(spec, list(DEFAULT_TIERS))
    strict = [r.arrival_s for r in w.requests if r.tier == "strict"]
    relaxed = [r.arrival_s for r in w.requests if r.tier == "relaxed"]
    # The burst moved from the start to the middle (cycle 99 * 51/50 = 100.98 s).
    assert strict[0] == pytest.approx(49.0)
    assert strict[1:] == pytest.approx([100.98 - 50 + 0.01 * i for i in range(50)])
    assert relaxed == pytest.approx([float(i) for i in range(100)])
    assert w.nominal_s == pytest.approx(100.0)  # the shorter cycle: steady's 100 s
    assert [r.arrival_s for r in w.requests] == sorted(r.arrival_s for r in w.requests)


def test_keep_thins_deterministically_and_horizon_repeats(tmp_path: Path) -> None:
    a = jsonl(tmp_path, "a.jsonl", [0.1 * i for i in range(2000)])
    full, _ = compose_sources([parse_tier_source(f"bg={a}")])
    thin, _ = compose_sources([parse_tier_source(f"bg={a}:keep=0.3")], seed=5)
    assert 540 <= len(thin) <= 660
    assert {r.input_len for r in thin} <= {r.input_len for r in full}
    again, _ = compose_sources([parse_tier_source(f"bg={a}:keep=0.3")], seed=5)
    other, _ = compose_sources([parse_tier_source(f"bg={a}:keep=0.3")], seed=6)
    assert again == thin and other != thin
    twice, horizon = compose_sources([parse_tier_source(f"bg={a}")], horizon_s=400.0)
    assert horizon == 400.0 and len(twice) == 4000
    assert twice[2000].arrival_s == pytest.approx(200.0) and twice[2000].input_len == 1


def test_sources_exclude_a_mix_and_need_known_tiers(tmp_path: Path) -> None:
    a = jsonl(tmp_path, "a.jsonl", [0.0, 1.0])
    with pytest.raises(ValueError, match="one way to assign tiers"):
        build_workload(
            WorkloadSpec(trace="", tier_sources=(f"strict={a}",), tier_mix="strict=1"),
            list(DEFAULT_TIERS),
        )
    with pytest.raises(ValueError, match="gold"):
        build_workload(WorkloadSpec(trace="", tier_sources=(f"gold={a}",)), list(DEFAULT_TIERS))


def test_bench_dry_run_shows_shares_per_quarter(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = jsonl(tmp_path, "a.jsonl", [float(i) for i in range(100)])
    argv = ["--dry-run", "--tier-source", f"strict={a}:offset=0.5", "--tier-source"]
    assert bench_main([*argv, f"background={a}:keep=0.5"]) == 0
    out = capsys.readouterr().out
    assert "'strict': 100" in out and "tier shares per quarter: background" in out
    assert bench_main(["--dry-run", "--trace", a, "--tier-source", f"strict={a}"]) == 2
    sched = "step:strict=1@0.5:relaxed=1"
    assert bench_main(["--dry-run", "--trace", a, "--mix-schedule", sched]) == 0
    out = capsys.readouterr().out
    assert "strict 1.00 | strict 1.00 | relaxed 1.00 | relaxed 1.00" in out


def test_router_style_background_tier_loads(tmp_path: Path) -> None:
    path = tmp_path / "tiers.json"
    tiers = [
        {"name": "strict", "ttft_ms": 100, "tpot_ms": 10},
        {"name": "background", "ttft_ms": 0, "tpot_ms": 0, "background": True},
    ]
    path.write_text(json.dumps(tiers))
    bg = load_tiers_file(path)[1]
    assert bg.background and bg.ttft_ms == float("inf") and bg.tpot_ms == float("inf")
