"""The planner and simulator through `nitsum._core` and `nitsum simulate` (hand-computed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from nitsum import _core

core = pytest.importorskip("nitsum._core")
if not hasattr(core, "plan"):
    pytest.skip("nitsum._core built without the planner", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]

# Prefill 10 ms + 0.1 ms/token; decode step 10 ms + 1 ms per sequence. Tier A (TTFT 200,
# TPOT 61, 100 in / 11 out): a mixed iteration pays the 10 ms once, 10 + 2b ≤ 61 → batch 25
# at 60 ms/iteration = 41.67 rps per device; residence 172.4 + 600 ms.
LINEAR = {
    "schema": "nitsum-profile/1",
    "device": "t",
    "model": "m",
    "tp_levels": [1],
    "prefill": {"1": [{"tokens": 1, "ms": 10.1}, {"tokens": 1001, "ms": 110.1}]},
    "decode": {
        "1": [{"batch": 1, "context": 10, "ms": 11}, {"batch": 64, "context": 10, "ms": 74}]
    },
}
TIERS = [core.Tier("A", 200.0, 61.0)]
DEMAND = [core.TierDemand("A", 50.0, core.LengthStats(100), core.LengthStats(11))]
MIXED_ONLY = core.PlannerConfig(disaggregation=False, target_utilization=1.0)


def _plan(previous: _core.Plan | None = None) -> _core.Plan:
    return core.plan(core.Profile(json.dumps(LINEAR)), TIERS, DEMAND, 4, previous, MIXED_ONLY)


def test_plan_one_tier_by_hand() -> None:
    plan = _plan()
    groups = plan.groups
    assert [g.tiers for g in groups] == [["A"], ["A"], [], []]
    assert groups[0].max_rps == pytest.approx(125 / 3)
    assert groups[0].max_inflight == pytest.approx(125 / 3 * 0.7724)
    assert plan.batch_caps == [25.0, 25.0, 0.0, 0.0]
    assert [g.accepts_background for g in groups] == [False, False, True, True]


def test_plan_is_stable_given_the_previous_plan() -> None:
    first = _plan()
    again = _plan(core.Plan(first.epoch, first.groups))
    assert again.groups == first.groups
    assert again.epoch == first.epoch + 1


def test_plan_rejects_bad_input_clearly() -> None:
    with pytest.raises(ValueError, match="schema"):
        core.Profile(json.dumps({**LINEAR, "schema": "x"}))
    with pytest.raises(ValueError, match="unknown tier"):
        _plan(core.Plan(1, [core.GroupPlan([0], 1, "mixed", ["B"])]))
    with pytest.raises(ValueError, match="num_devices"):
        core.plan(core.Profile(json.dumps(LINEAR)), TIERS, DEMAND, 0)


def _sim_config(requests: list[dict]) -> dict:
    const = {
        **LINEAR,
        "prefill": {"1": [{"tokens": 10, "ms": 10}, {"tokens": 20, "ms": 20}]},
        "decode": {
            "1": [{"batch": 1, "context": 1, "ms": 5}, {"batch": 64, "context": 1, "ms": 5}]
        },
    }
    return {
        "profile": const,
        "tiers": [{"name": "t", "ttft_ms": 15.0, "tpot_ms": 6.0}],
        "devices": 1,
        "policy": {"kind": "static_tp", "tp": 1},
        "requests": requests,
    }


def test_simulate_single_device_queue_by_hand() -> None:
    reqs = [
        {"arrival_s": t, "input_len": 10, "output_len": 3, "tier": "t"} for t in (0.0, 0.004, 2.0)
    ]
    out = json.loads(core.simulate(json.dumps(_sim_config(reqs))))
    rec = out["records"]
    # Prefill 10 ms; A's first decode step rides with B's prefill (15 ms); then 5 ms steps.
    assert [r["ttft_ms"] for r in rec] == pytest.approx([10.0, 21.0, 10.0])
    assert [r["e2e_ms"] for r in rec] == pytest.approx([30.0, 31.0, 20.0])
    assert [r["met"] for r in rec] == [False, False, True]
    assert out["goodput_rps"] == pytest.approx(0.5)


def test_simulate_cli_writes_result(tmp_path: Path) -> None:
    from nitsum.simulate import main

    cfg = _sim_config([])
    (tmp_path / "p.json").write_text(json.dumps(cfg["profile"]))
    (tmp_path / "t.json").write_text(json.dumps(cfg["tiers"]))
    trace = [{"arrival_s": 0.1 * k, "input_len": 10, "output_len": 3} for k in range(5)]
    (tmp_path / "trace.json").write_text(json.dumps(trace))
    out = tmp_path / "out.json"
    argv = ["--profile", str(tmp_path / "p.json"), "--tiers", str(tmp_path / "t.json")]
    argv += ["--trace", str(tmp_path / "trace.json"), "--devices", "1", "--policy", "static"]
    argv += ["--tp", "1", "--out", str(out)]
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert (result["policy"], result["met"], result["requests"]) == ("static-tp1", 5, 5)
    assert main([*argv[:-2], "--policy", "static", "--tp", "2"]) == 1


def test_shipped_analytic_profiles_load() -> None:
    for path in sorted((ROOT / "profiles").glob("*-analytic.json")):
        profile = json.loads(path.read_text())
        assert profile["analytic"] is True
        plan = core.plan(core.Profile(path.read_text()), TIERS, DEMAND, 8)
        assert sum(g.tp for g in plan.groups) <= 8
