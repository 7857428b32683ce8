"""`nitsum simulate` with shifting-mix workloads (mix schedule, per-tier sources, background)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

core = pytest.importorskip("nitsum._core")
if not hasattr(core, "simulate"):
    pytest.skip("nitsum._core built without the simulator", allow_module_level=True)

from nitsum.simulate import main  # noqa: E402

PROFILE = {
    "schema": "nitsum-profile/1",
    "device": "t",
    "model": "m",
    "tp_levels": [1],
    "prefill": {"1": [{"tokens": 1, "ms": 10.1}, {"tokens": 1001, "ms": 110.1}]},
    "decode": {
        "1": [{"batch": 1, "context": 10, "ms": 11}, {"batch": 64, "context": 10, "ms": 74}]
    },
}
TIERS = [
    {"name": "strict", "ttft_ms": 500.0, "tpot_ms": 100.0},
    {"name": "relaxed", "ttft_ms": 5000.0, "tpot_ms": 200.0},
    {"name": "background", "ttft_ms": 0, "tpot_ms": 0, "background": True},
]


def _files(tmp_path: Path) -> list[str]:
    (tmp_path / "p.json").write_text(json.dumps(PROFILE))
    (tmp_path / "t.json").write_text(json.dumps(TIERS))
    rows = [{"timestamp": 0.5 * i, "input_length": 20, "output_length": 4} for i in range(40)]
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    return ["--profile", str(tmp_path / "p.json"), "--tiers", str(tmp_path / "t.json")]


def test_simulate_mix_schedule_with_background(tmp_path: Path) -> None:
    argv = _files(tmp_path) + ["--trace", str(tmp_path / "a.jsonl"), "--devices", "2"]
    out = tmp_path / "out.json"
    sched = "step:strict=1@0.5:relaxed=0.5,background=0.5"
    assert main([*argv, "--mix-schedule", sched, "--records", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    recs = sorted(result["records"], key=lambda r: r["arrival_s"])
    first = {r["tier"] for r in recs if r["arrival_s"] < 9.75}
    second = [r["tier"] for r in recs if r["arrival_s"] >= 9.75]
    assert first == {"strict"} and len(second) == 20
    assert set(second) == {"relaxed", "background"}
    n_bg = second.count("background")
    assert result["requests"] == 40 - n_bg  # goodput counts SLO tiers only
    assert result["per_tier"]["strict"]["requests"] == 20


def test_simulate_tier_sources_rate_scale_and_errors(tmp_path: Path) -> None:
    argv = _files(tmp_path) + ["--devices", "2", "--records"]
    a = str(tmp_path / "a.jsonl")
    out = tmp_path / "out.json"
    src = ["--tier-source", f"strict={a}", "--tier-source", f"relaxed={a}:offset=0.5:keep=0.5"]
    assert main([*argv, *src, "--rate-scale", "2", "--out", str(out)]) == 0
    recs = json.loads(out.read_text())["records"]
    strict = sorted(r["arrival_s"] for r in recs if r["tier"] == "strict")
    assert strict == pytest.approx([0.25 * i for i in range(40)])
    assert 8 <= sum(r["tier"] == "relaxed" for r in recs) <= 32
    assert main([*argv, *src, "--trace", a]) == 1  # --trace and --tier-source
    assert main([*argv, "--trace", a, "--mix-schedule", "step:gold=1"]) == 1
    assert main([*argv, "--trace", a, "--mix-schedule", "sine:strict=1", "--mix", "a=1"]) == 1
    assert main(argv) == 1  # no trace at all
