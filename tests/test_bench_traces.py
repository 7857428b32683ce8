"""Trace loaders, the bursty generator, transformations, tiers and workload assembly."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from nitsum.bench.bursty import BurstySpec, UniformLengths, generate_bursty
from nitsum.bench.tiers import (
    assign_by_length,
    assign_by_mix,
    load_tiers_file,
    parse_tier_arg,
)
from nitsum.bench.traces import (
    TraceError,
    TraceRequest,
    default_trace_dir,
    load_azure_csv,
    load_jsonl,
    load_trace_file,
)
from nitsum.bench.transform import limit, scale_lengths, scale_rate, slice_window
from nitsum.bench.workload import Workload, WorkloadSpec, build_workload, run_requests

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


# --- Azure CSV ---------------------------------------------------------------------------


def test_azure_csv_arrivals_keep_100ns_resolution(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        "t.csv",
        HEADER + "2023-11-16 18:17:03.9799600,4808,10\n"
        "2023-11-16 18:17:04.0319600,3180,8\n"
        "2023-11-16 18:18:00.0000001,5,1\n",
    )
    reqs = load_azure_csv(p)
    assert [r.input_len for r in reqs] == [4808, 3180, 5]
    assert [r.output_len for r in reqs] == [10, 8, 1]
    assert reqs[0].arrival_s == 0.0
    assert reqs[1].arrival_s == pytest.approx(0.052, abs=1e-9)
    # 18:18:00.0000001 − 18:17:03.97996 = 56.0200401 s
    assert reqs[2].arrival_s == pytest.approx(56.0200401, abs=1e-9)
    assert all(r.tier is None for r in reqs)


def test_azure_csv_sorts_and_accepts_reordered_columns(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        "t.csv",
        "GeneratedTokens,TIMESTAMP,ContextTokens\n"
        "7,2023-11-16 18:00:02.5000000,20\n"
        "9,2023-11-16 18:00:01.0000000,30\n\n",
    )
    reqs = load_azure_csv(p)
    assert [(r.arrival_s, r.input_len, r.output_len) for r in reqs] == [(0.0, 30, 9), (1.5, 20, 7)]


@pytest.mark.parametrize(
    ("body", "line", "what"),
    [
        ("2023-11-16 18:17:03.9799600,4808,10\n2023-11-16 18:17:04.0,abc,8\n", 3, "ContextTokens"),
        ("2023-13-16 18:17:03.9799600,4808,10\n", 2, "bad TIMESTAMP"),
        ("2023-11-16 18:17:03.97x,4808,10\n", 2, "fraction"),
        (
            "2023-11-16 18:17:03.1,1,1\n2023-11-16 18:17:03.2,1,1\n2023-11-16 18:17:04.0,1\n",
            4,
            "3 fields",
        ),
        ("2023-11-16 18:17:03.1,1,0\n", 2, "GeneratedTokens must be >= 1"),
    ],
)
def test_azure_csv_malformed_row_names_file_and_line(
    tmp_path: Path, body: str, line: int, what: str
) -> None:
    p = write(tmp_path, "bad.csv", HEADER + body)
    with pytest.raises(TraceError) as ei:
        load_azure_csv(p)
    assert ei.value.line == line
    assert f"bad.csv:{line}:" in str(ei.value)
    assert what in str(ei.value)


def test_azure_csv_missing_column(tmp_path: Path) -> None:
    p = write(tmp_path, "h.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:17:03.1,5\n")
    with pytest.raises(TraceError, match=r"h\.csv:1: header lacks column\(s\) GeneratedTokens"):
        load_azure_csv(p)


@pytest.mark.skipif(
    not (default_trace_dir() / "AzureLLMInferenceTrace_code.csv").exists(),
    reason="shared traces not present",
)
def test_shared_azure_code_trace_matches_sources_md() -> None:
    reqs = load_trace_file("azure-code")
    # SOURCES.md: 8,819 requests, 18:17:03.97996 → 19:14:19.9280160 = 3,435.948056 s.
    assert len(reqs) == 8819
    assert reqs[-1].arrival_s == pytest.approx(3435.948056, abs=1e-6)
    assert sum(r.input_len for r in reqs) / len(reqs) == pytest.approx(2047.8, abs=0.05)
    assert (min(r.input_len for r in reqs), max(r.input_len for r in reqs)) == (3, 7437)


# --- JSONL -------------------------------------------------------------------------------


def test_jsonl_rebases_and_keeps_tiers(tmp_path: Path) -> None:
    lines = [
        {"timestamp": 12.5, "input_length": 100, "output_length": 20, "tier": "strict"},
        {"timestamp": 10.0, "input_length": 50, "output_length": 5.0},
    ]
    p = write(tmp_path, "t.jsonl", "\n".join(json.dumps(x) for x in lines) + "\n\n")
    assert load_jsonl(p) == [TraceRequest(0.0, 50, 5, None), TraceRequest(2.5, 100, 20, "strict")]


@pytest.mark.parametrize(
    ("line2", "what"),
    [
        ("{not json", "invalid JSON"),
        ('{"timestamp": 1, "input_length": 3}', "missing field 'output_length'"),
        ('{"timestamp": 1, "input_length": true, "output_length": 3}', "input_length must be"),
        ('{"timestamp": 1, "input_length": -4, "output_length": 3}', "input_length must be >= 1"),
        ('{"timestamp": "x", "input_length": 4, "output_length": 3}', "timestamp must be"),
        ('{"timestamp": 1, "input_length": 4, "output_length": 3, "tier": 7}', "tier must be"),
        ("[1, 2]", "expected a JSON object"),
    ],
)
def test_jsonl_malformed_line_names_line_number(tmp_path: Path, line2: str, what: str) -> None:
    good = '{"timestamp": 0, "input_length": 4, "output_length": 3}'
    p = write(tmp_path, "bad.jsonl", f"{good}\n\n{line2}\n{good}\n")
    with pytest.raises(TraceError) as ei:
        load_jsonl(p)
    assert ei.value.line == 3  # the blank line 2 still counts
    assert "bad.jsonl:3:" in str(ei.value) and what in str(ei.value)


def test_load_trace_file_dispatch_errors(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="unknown trace format"):
        load_trace_file(str(write(tmp_path, "t.txt", "")))
    with pytest.raises(TraceError, match="no such file"):
        load_trace_file(str(tmp_path / "missing.csv"))
    with pytest.raises(TraceError, match="not found"):
        load_trace_file("azure-conv", trace_dir=tmp_path)


# --- bursty ------------------------------------------------------------------------------


def test_bursty_phases_cover_duration() -> None:
    spec = BurstySpec(low_rate=1, high_rate=9, period_s=20, duration_s=25, burst_fraction=0.25)
    assert spec.phases() == [(0.0, 15.0, 1), (15.0, 20.0, 9), (20.0, 25.0, 1)]


def test_bursty_counts_per_phase_are_poisson() -> None:
    # 20 periods of 10 s low at 2/s then 10 s high at 20/s: the low phases hold
    # Poisson(400) arrivals (σ = 20), the high ones Poisson(4000) (σ ≈ 63.2). Allow 4σ.
    spec = BurstySpec(low_rate=2, high_rate=20, period_s=20, duration_s=400, seed=7)
    reqs = generate_bursty(spec)
    low = sum(1 for r in reqs if r.arrival_s % 20 < 10)
    high = len(reqs) - low
    assert abs(low - 400) <= 4 * 20
    assert abs(high - 4000) <= 4 * math.sqrt(4000)
    assert all(0 <= r.arrival_s < 400 for r in reqs)
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(reqs, reqs[1:], strict=False))
    # Uniform 128..4000: mean 2064, σ ≈ 1117.8, so the sample mean is within 4σ/√n.
    assert all(128 <= r.input_len <= 4000 and 64 <= r.output_len <= 512 for r in reqs)
    mean_in = sum(r.input_len for r in reqs) / len(reqs)
    assert abs(mean_in - 2064) <= 4 * 1117.8 / math.sqrt(len(reqs))


def test_bursty_is_seeded() -> None:
    a = generate_bursty(BurstySpec(duration_s=30, seed=1))
    assert a == generate_bursty(BurstySpec(duration_s=30, seed=1))
    assert a != generate_bursty(BurstySpec(duration_s=30, seed=2))
    assert UniformLengths.parse("256") == UniformLengths(256, 256)


# --- transformations ---------------------------------------------------------------------

REQS = [TraceRequest(t, 1000, 100) for t in (0.0, 5.0, 10.0, 15.0, 20.0)]


def test_slice_window_rebases_to_window_start() -> None:
    out = slice_window(REQS, start_s=4.0, duration_s=11.0)  # [4, 15)
    assert [r.arrival_s for r in out] == [1.0, 6.0]
    assert [r.arrival_s for r in slice_window(REQS, start_s=15.0)] == [0.0, 5.0]


def test_scale_rate_and_limit() -> None:
    assert [r.arrival_s for r in scale_rate(REQS, 2.0)] == [0.0, 2.5, 5.0, 7.5, 10.0]
    assert limit(REQS, 2) == REQS[:2]
    with pytest.raises(ValueError):
        scale_rate(REQS, 0.0)


def test_scale_lengths_and_clamp_to_context() -> None:
    reqs = [TraceRequest(0, 3000, 100), TraceRequest(0, 5000, 300), TraceRequest(0, 10, 5000)]
    out = scale_lengths(reqs, input_scale=0.5, max_context=2048)
    # 1500+100 fits; 2500+300 → input clamped to 2048−300; output 5000 → 2047, input 5 → 1.
    assert [(r.input_len, r.output_len) for r in out] == [(1500, 100), (1748, 300), (1, 2047)]
    assert scale_lengths([TraceRequest(0, 3, 3)], 0.1, 0.1)[0] == TraceRequest(0, 1, 1)


# --- tiers -------------------------------------------------------------------------------


def test_assign_by_mix_exact_counts_and_seeded() -> None:
    reqs = [TraceRequest(float(i), 10, 10) for i in range(10)]
    out = assign_by_mix(reqs, "strict=0.3,relaxed=0.5,background=0.2", seed=3)
    tiers = [r.tier for r in out]
    assert (tiers.count("strict"), tiers.count("relaxed"), tiers.count("background")) == (3, 5, 2)
    assert tiers == [r.tier for r in assign_by_mix(reqs, "strict=3,relaxed=5,background=2", 3)]
    # 7 requests at 1/1/1: 2.33 each, the one left over goes to the first tier.
    counts = [r.tier for r in assign_by_mix(reqs[:7], "a=1,b=1,c=1")]
    assert (counts.count("a"), counts.count("b"), counts.count("c")) == (3, 2, 2)


def test_assign_by_length_thresholds() -> None:
    reqs = [TraceRequest(0, n, 1) for n in (100, 512, 513, 2048, 4000)]
    out = assign_by_length(reqs, "strict:512,relaxed:2048,background")
    assert [r.tier for r in out] == ["strict", "strict", "relaxed", "relaxed", "background"]
    # No catch-all: longer prompts keep the tier they had.
    keep = assign_by_length([TraceRequest(0, 5000, 1, "x")], "strict:512")
    assert keep[0].tier == "x"
    with pytest.raises(ValueError, match="increase"):
        assign_by_length(reqs, "a:900,b:100")


def test_tier_specs_inline_and_files(tmp_path: Path) -> None:
    t = parse_tier_arg("strict:ttft=300,tpot=10")
    assert (t.name, t.ttft_ms, t.tpot_ms, t.background) == ("strict", 300.0, 10.0, False)
    bg = parse_tier_arg("batch:background")
    assert bg.background and bg.ttft_ms == math.inf
    with pytest.raises(ValueError, match="tpot_ms > 0"):
        parse_tier_arg("strict:ttft=300")
    toml = write(
        tmp_path,
        "tiers.toml",
        '[[tiers]]\nname = "gold"\nttft_ms = 200\ntpot_ms = 10\nweight = 2\n'
        '[[tiers]]\nname = "bg"\nbackground = true\n'
        '[[keys]]\nkey = "k1"\ntiers = ["gold"]\n',
    )
    got = load_tiers_file(toml)
    assert [(x.name, x.ttft_ms, x.tpot_ms, x.background) for x in got] == [
        ("gold", 200.0, 10.0, False),
        ("bg", math.inf, math.inf, True),
    ]
    js = write(tmp_path, "tiers.json", json.dumps([{"name": "s", "ttft_ms": 1, "tpot_ms": 2}]))
    assert load_tiers_file(js)[0].tpot_ms == 2.0


# --- workload ----------------------------------------------------------------------------


def test_run_requests_duration() -> None:
    w = Workload(REQS, nominal_s=25.0)
    reqs, dur = run_requests(w, 2.0, None)
    assert len(reqs) == 5 and dur == 12.5  # the nominal window, compressed
    reqs, dur = run_requests(w, 2.0, 3)
    assert len(reqs) == 3 and dur == 7.5  # up to the first request left out
    assert run_requests(Workload(REQS, None), 1.0, None)[1] == 20.0  # last arrival
    assert run_requests(Workload(REQS[:1], None), 1.0, None)[1] is None


def test_build_workload_window_tiers_and_unknown(tmp_path: Path) -> None:
    lines = [{"timestamp": t, "input_length": 4000, "output_length": 100} for t in range(10)]
    p = write(tmp_path, "w.jsonl", "\n".join(json.dumps(x) for x in lines))
    tiers = [parse_tier_arg("s:ttft=1,tpot=1"), parse_tier_arg("bg:background")]
    spec = WorkloadSpec(trace=str(p), start_s=2, duration_s=5, max_context=2048)
    w = build_workload(spec, tiers)
    assert w.nominal_s == 5
    assert [(r.arrival_s, r.input_len, r.tier) for r in w.requests] == [
        (float(i), 1948, "s") for i in range(5)
    ]
    with pytest.raises(ValueError, match="not in the tiers spec"):
        build_workload(WorkloadSpec(trace=str(p), tier_mix="gold=1"), tiers)
