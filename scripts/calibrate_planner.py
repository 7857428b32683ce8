"""Planner estimate vs simulated engine, one layout at a time.

Plans a trace with its whole-trace demand (each TP level alone, then all levels), replays
that plan as a `fixed_plan` simulation and prints, per tier, the planned SLO throughput
(`max_rps` of its prefill-capable groups) next to the goodput the simulated engine delivers.
A layout whose realized goodput is far below its estimate is one the planner over-rates.

    .venv/bin/python scripts/calibrate_planner.py --tiers TIERS.json --rate-scale 240
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter

from nitsum import _core
from nitsum.simulate import build_config, parser


def length_stats(values: list[int]) -> _core.LengthStats:
    x = sorted(values)
    n = len(x)
    return _core.LengthStats(statistics.mean(x), count=n, p50=x[n // 2], p90=x[int(n * 0.9)],
                             p99=x[int(n * 0.99)])  # fmt: skip


def group_json(g: _core.GroupPlan) -> dict[str, object]:
    """A planned group as the simulator's `fixed_plan` reads it (`GroupPlan` JSON)."""
    keys = ("members", "tp", "pp", "role", "tiers", "accepts_background", "max_rps",
            "max_inflight")  # fmt: skip
    return {k: getattr(g, k) for k in keys}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="profiles/h100-llama3-8b-analytic.json")
    ap.add_argument("--trace", default="../shared/traces/AzureLLMInferenceTrace_conv.csv")
    ap.add_argument("--tiers", required=True, help="JSON list of tiers {name, ttft_ms, tpot_ms}")
    ap.add_argument("--rate-scale", type=float, default=1.0)
    ap.add_argument("--devices", type=int, default=64)
    ap.add_argument("--mix", default="strict=0.5,relaxed=0.5")
    ap.add_argument("--levels", default="1,2,4,8", help="TP levels to try alone")
    a = ap.parse_args()
    cfg = build_config(parser().parse_args([
        "--profile", a.profile, "--tiers", a.tiers, "--trace", a.trace, "--mix", a.mix,
        "--rate-scale", str(a.rate_scale), "--devices", str(a.devices),
    ]))  # fmt: skip
    reqs = cfg["requests"]
    span = max(r["arrival_s"] for r in reqs) - min(r["arrival_s"] for r in reqs)
    demand = []
    for t in cfg["tiers"]:
        mine = [r for r in reqs if r["tier"] == t["name"]]
        demand.append(_core.TierDemand(t["name"], len(mine) / span,
                                       length_stats([r["input_len"] for r in mine]),
                                       length_stats([r["output_len"] for r in mine])))  # fmt: skip
    tiers = [_core.Tier(t["name"], t["ttft_ms"], t["tpot_ms"], weight=t.get("weight", 1.0),
                        background=t.get("background", False)) for t in cfg["tiers"]]  # fmt: skip
    profile = _core.Profile(json.dumps(cfg["profile"]))
    # The simulator's planner settings (docs/results.md), without hysteresis: one decision.
    choices = [[int(t) for t in a.levels.split(",")][i : i + 1] for i in range(4)] + [None]
    print(f"{len(reqs)} requests over {span:.1f} s, {a.devices} devices")
    for levels in [c for c in choices if c != []]:
        pc = _core.PlannerConfig(
            tp_levels=levels, slo_margin=0.9, target_utilization=0.5, keep_utilization=0.0
        )
        out = _core.plan(profile, tiers, demand, a.devices, None, pc)
        layout = Counter(f"{g.role[0].upper()}{g.tp}:{','.join(g.tiers) or '-'}"
                         for g in out.groups)  # fmt: skip
        planned: dict[str, float] = {}
        for g in out.groups:
            for t in g.tiers if g.role != "decode" else []:
                planned[t] = planned.get(t, 0.0) + g.max_rps
        groups = [group_json(g) for g in out.groups]
        policy = {"kind": "fixed_plan", "plan": {"epoch": 1, "groups": groups},
                  "batch_caps": out.batch_caps}  # fmt: skip
        res = json.loads(_core.simulate(json.dumps(cfg | {"policy": policy})))
        real = {k: round(v["goodput_rps"], 1) for k, v in res["per_tier"].items()}
        name = f"TP {levels[0]}" if levels else "all levels"
        print(f"{name:>10}: {dict(layout)}")
        print(f"{'':>10}  planned {dict((k, round(v, 1)) for k, v in planned.items())}"
              f"  delivered {real}  total {res['goodput_rps']:.1f} req/s")  # fmt: skip


if __name__ == "__main__":
    main()
