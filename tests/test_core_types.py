"""`nitsum._core` takes and returns typed classes (scheduler-rs/src/python/): the same
planner and cost-model answers as its former JSON API on the same inputs (recorded from it
at 78b9673), read field by field, and input of the wrong type refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nitsum import _core

ROOT = Path(__file__).resolve().parent.parent
PROFILE = _core.Profile((ROOT / "profiles" / "h100-llama3-8b-analytic.json").read_text())

# `_core.plan` (JSON) on the analytic H100 profile, 8 devices, the default SLO tiers and
# this demand: per group (leader, tier, max_rps, max_inflight), all TP 1 mixed; batch caps.
JSON_GROUPS = [
    (0, ["strict"], 23.302112484242066, 128.49796408564524),
    (1, ["relaxed"], 14.23836627133841, 32.24406799245825),
    (2, ["strict"], 23.302112484242066, 128.49796408564524),
    (3, ["relaxed"], 14.23836627133841, 32.24406799245825),
    (4, ["strict"], 23.302112484242066, 128.49796408564524),
    (5, ["relaxed"], 14.23836627133841, 32.24406799245825),
    (6, [], 0.0, 0.0),
    (7, [], 0.0, 0.0),
]
JSON_CAPS = [127.0, 31.0, 127.0, 31.0, 127.0, 31.0, 0.0, 0.0]

# `BindingModel.decide` (JSON) for a TP-4 binding of a 4096-token prompt, TTFT 100 ms, over
# four idle TP-1 replicas.
JSON_DECISION = json.loads(
    '{"mode":"full","level":4,"replica":0,"gain":0.636423983903784,"options":['
    '{"mode":"dp","ttft_ms":116.5614,"tpot_ms":6.4960296875,"meets":0.3616217438447671,'
    '"lost_tokens":0.0,"value":0.3616217438447671},'
    '{"mode":"prefill","ttft_ms":39.0786,"tpot_ms":6.4960296875,"meets":0.9980457277462323,'
    '"lost_tokens":0.0,"value":0.9980457277462323},'
    '{"mode":"full","ttft_ms":39.0786,"tpot_ms":2.4907812500000004,"meets":0.998045727748551,'
    '"lost_tokens":0.0,"value":0.998045727748551}]}'
)


def demand(tier: str, rate: float, prompt: float, output: float) -> _core.TierDemand:
    return _core.TierDemand(tier, rate, _core.LengthStats(prompt), _core.LengthStats(output))


def test_a_typed_plan_equals_the_json_one() -> None:
    tiers = [t for t in _core.default_tiers() if not t.background]
    want = [demand("strict", 30.0, 1024, 256), demand("relaxed", 20.0, 2048, 128)]
    plan = _core.plan(PROFILE, tiers, want, 8)
    assert plan.epoch == 1 and plan.batch_caps == JSON_CAPS
    got = [(g.members[0], g.tiers, g.max_rps, g.max_inflight) for g in plan.groups]
    assert got == JSON_GROUPS
    assert {(g.tp, g.pp, g.role, len(g.members)) for g in plan.groups} == {(1, 1, "mixed", 1)}
    assert [g.accepts_background for g in plan.groups] == [False] * 6 + [True] * 2
    # The plan goes back in as `previous`: the same groups, the next epoch.
    again = _core.plan(PROFILE, tiers, want, 8, previous=plan)
    assert again.groups == plan.groups and again.epoch == 2


def test_a_typed_decision_equals_the_json_one() -> None:
    idle = [_core.ReplicaLoad(tp=1, decoding=0, context=1024.0)] * 4
    query = _core.BindQuery(
        4, 4096, 128, idle, ttft_ms=100.0, tpot_ms=50.0, token_budget=2048,
        replica_output_tokens=256.0,
    )  # fmt: skip
    d = _core.BindingModel(PROFILE).decide(query)
    assert (d.mode, d.level, d.replica, d.gain) == (
        JSON_DECISION["mode"], JSON_DECISION["level"], JSON_DECISION["replica"],
        JSON_DECISION["gain"],
    )  # fmt: skip
    keys = ("mode", "ttft_ms", "tpot_ms", "meets", "lost_tokens", "value")
    assert [{k: getattr(o, k) for k in keys} for o in d.options] == JSON_DECISION["options"]


def test_default_tiers_are_typed_with_the_routers_values() -> None:
    strict, relaxed = _core.default_tiers()[:2]
    assert (strict.name, strict.ttft_ms, strict.tpot_ms, strict.weight) == ("strict", 250, 25, 1)
    assert (relaxed.name, relaxed.ttft_ms, relaxed.tpot_ms) == ("relaxed", 2000.0, 100.0)
    assert strict.preempt and strict.bind_tp is None and not strict.background
    assert strict == _core.Tier("strict", 250.0, 25.0, max_inflight=strict.max_inflight)


def test_wrong_types_and_values_are_refused() -> None:
    with pytest.raises(TypeError):
        _core.plan("{}", [], [], 4)  # type: ignore[arg-type]  # a JSON string is no Profile
    with pytest.raises(ValueError, match="role"):
        _core.GroupPlan([0], 1, "sideways", [])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="missing field `device`"):
        _core.Profile(json.dumps({"schema": "x"}))
    with pytest.raises(ValueError, match="no replicas"):
        _core.BindingModel(PROFILE).decide(_core.BindQuery(4, 1, 1, []))
    with pytest.raises(AttributeError):
        PROFILE.tp_levels = [1]  # type: ignore[misc]  # frozen


def test_planner_config_keeps_the_routers_defaults_and_changes_the_plan() -> None:
    cfg = _core.PlannerConfig(tp_levels=[2])
    assert (cfg.tp_levels, cfg.target_utilization, cfg.max_prefill_batch) == ([2], 0.5, 64)
    assert cfg.prior_lengths == (1024.0, 256.0) and cfg == _core.PlannerConfig(tp_levels=[2])
    tiers = [t for t in _core.default_tiers() if not t.background]
    want = [demand("strict", 30.0, 1024, 256)]
    plan = _core.plan(PROFILE, tiers, want, 8, config=cfg)
    assert {g.tp for g in plan.groups} == {2} and len(plan.groups) == 4
