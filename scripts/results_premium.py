"""The premium-tier sweep of results.py (issue 32): per-request TP binding at GPU scale.

A premium interactive tier whose TTFT a TP-1 replica cannot meet for its mean prompt, but a
TP-2 or TP-4 group can, carries `bind_tp`; it is mixed with the relaxed and background tiers
of the `apps` workload. Each load point runs the same requests with the simulator's binding
`off` (bind_tp ignored), `cost` (the cost model of scheduler-rs/src/binding/ decides, as
the worker does) and `always` (forced full binding, Flying Serving as it was), under two
layouts: DP replicas (Nitsum fixed at TP 1, the layout binding is for) and adaptive Nitsum.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from nitsum import _core
from nitsum.simulate import load_arrivals, shifting_requests
from results_sim import SIM_DEFAULTS
from results_sweeps import TRACE_DIR, TRACES
from results_tiers import BACKGROUND_TIER, derive_tiers, mean_lengths, prefill_ms

# The premium tier: the azure-code arrivals thinned to KEEP (a minority, as priority
# traffic is), TTFT = TTFT_FACTOR × the TP-2 prefill of the code trace's mean prompt.
KEEP = 0.3
BIND_TP = 4
TTFT_FACTOR = 1.5
SOURCES = (
    f"premium=azure-code:keep={KEEP}",
    "relaxed=azure-conv:offset=0.5",
    "background=azure-conv:offset=0.25:keep=0.2",
)
SCALES = {8: [2, 4, 8, 12, 16], 64: [16, 32, 64, 96, 128]}
QUICK_SCALES = {8: [4, 12]}
BINDINGS = ("off", "cost", "always")
LAYOUTS = {"dp": {"kind": "nitsum_fixed_tp", "tp": 1}, "nitsum": {"kind": "nitsum"}}


def premium_tiers(profile: dict, base: dict, args: argparse.Namespace) -> tuple[list[dict], dict]:
    """(premium, relaxed, background) tiers and the profile numbers the premium one is from."""
    code_in, _ = mean_lengths(base["code"])
    conv = derive_tiers(profile, *mean_lengths(base["conv"]), args.ttft_factor, args.tpot_factor)
    relaxed = next(t for t in conv[0] if t["name"] == "relaxed")
    why = {
        "mean_prompt": round(code_in, 1),
        **{f"tp{k}_prefill_ms": round(prefill_ms(profile, k, code_in), 2) for k in (1, 2, 4)},
    }
    premium = {
        "name": "premium",
        "ttft_ms": round(TTFT_FACTOR * why["tp2_prefill_ms"], 2),
        # NOTE: the relaxed tier's TPOT: the premium tier differs by its TTFT only, which is
        # what binding buys (a TP-k decode of one request rarely pays).
        "tpot_ms": relaxed["tpot_ms"],
        "bind_tp": BIND_TP,
    }
    return [premium, relaxed, BACKGROUND_TIER], why


def build(profile: dict, args: argparse.Namespace) -> list[dict]:
    """The premium sweeps (one per pool size), requests unscaled."""
    base = {t: load_arrivals(str(TRACE_DIR / f)) for t, f in TRACES.items()}
    if args.duration:
        base = {t: [r for r in rs if r["arrival_s"] < args.duration] for t, rs in base.items()}
    tiers, why = premium_tiers(profile, base, args)
    reqs = shifting_requests(
        tiers, trace=None, tier_sources=SOURCES, duration=args.duration, seed=args.seed
    )
    scales = QUICK_SCALES if args.quick else SCALES
    return [
        {
            "key": f"premium-{n}dev",
            "devices": n,
            "tiers": tiers,
            "why": why,
            "reqs": reqs,
            "scales": scales[n],
        }
        for n in args.devices
        if n in scales
    ]


def _run(
    profile: dict, tiers: list[dict], reqs: list[dict], n: int, policy: dict, binding: str
) -> dict[str, Any]:
    cfg = {
        "profile": profile,
        "tiers": tiers,
        "devices": n,
        "policy": policy,
        "requests": reqs,
        "records": False,
        "binding": binding,
        **SIM_DEFAULTS,
    }
    r = json.loads(_core.simulate(json.dumps(cfg)))
    p = r["per_tier"]["premium"]
    return {
        "goodput_rps": r["goodput_rps"],
        "attainment": r["attainment"],
        "premium_attainment": p["attainment"],
        "premium_ttft_p90_ms": p["ttft_ms"].get("p90"),
        "relaxed_attainment": r["per_tier"]["relaxed"]["attainment"],
        "bindings": r.get("bindings", {}),
        "duration_s": r["duration_s"],
    }


def run_point(args: tuple[dict, dict, float]) -> dict[str, Any]:
    """Every layout × binding at one load point of sweep `s`."""
    profile, s, k = args
    t0 = time.perf_counter()
    reqs = [dict(r, arrival_s=r["arrival_s"] / k) for r in s["reqs"]]
    runs = {
        f"{layout}-{b}": _run(profile, s["tiers"], reqs, s["devices"], pol, b)
        for layout, pol in LAYOUTS.items()
        for b in BINDINGS
    }
    dur = runs["dp-off"]["duration_s"]
    ratio = {
        f"{layout}-{b}": runs[f"{layout}-{b}"]["goodput_rps"]
        / max(runs[f"{layout}-off"]["goodput_rps"], 1e-9)
        for layout in LAYOUTS
        for b in ("cost", "always")
    }
    return {
        "rate_scale": k,
        "offered_rps": len(reqs) / dur,
        "runs": runs,
        "over_off": ratio,
        "wall_s": round(time.perf_counter() - t0, 2),
    }


def describe(s: dict, profile: dict, args: argparse.Namespace) -> dict[str, Any]:
    counts = {t["name"]: 0 for t in s["tiers"]}
    for r in s["reqs"]:
        counts[r["tier"]] += 1
    return {
        "key": s["key"],
        "group": "premium",
        "devices": s["devices"],
        "tiers": s["tiers"],
        "premium_basis": s["why"],
        "requests": len(s["reqs"]),
        "tier_shares": {k: round(v / len(s["reqs"]), 4) for k, v in counts.items()},
        "workload_flags": " ".join(f"--tier-source {x}" for x in SOURCES),
        "profile": args.profile,
        "seed": args.seed,
        "sim": SIM_DEFAULTS,
        "points": [],
    }


def _att(run: dict) -> str:
    return f"{run['goodput_rps']:.1f} ({run['premium_attainment']:.2f})"


def table(res: dict) -> str:
    """One sweep's table: goodput (premium attainment) per layout and binding, the ratios."""
    t = res["tiers"][0]
    lines = [
        f"#### premium tier, {res['devices']} devices",
        "",
        f"{res['requests']} requests (shares: "
        + ", ".join(f"{k} {v:.2f}" for k, v in res["tier_shares"].items())
        + f"); premium TTFT/TPOT {t['ttft_ms']:.1f}/{t['tpot_ms']:.2f} ms, bind_tp "
        f"{t['bind_tp']}.",
        "",
        "| rate scale | offered req/s | DP off | DP cost | DP always | DP cost / off "
        "| DP always / off | binds dp/prefill/full/hand-backs (DP cost) | Nitsum off "
        "| Nitsum cost | Nitsum always | Nitsum cost / off |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in res["points"]:
        r, o = p["runs"], p["over_off"]
        b = r["dp-cost"]["bindings"]
        counts = "/".join(str(b.get(x, 0)) for x in ("dp", "prefill", "full", "handbacks"))
        lines.append(
            f"| {p['rate_scale']:g} | {p['offered_rps']:.1f} | {_att(r['dp-off'])} | "
            f"{_att(r['dp-cost'])} | {_att(r['dp-always'])} | {o['dp-cost']:.2f} | "
            f"{o['dp-always']:.2f} | {counts} | {_att(r['nitsum-off'])} | "
            f"{_att(r['nitsum-cost'])} | {_att(r['nitsum-always'])} | {o['nitsum-cost']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def section(results: list[dict]) -> str:
    """The page's premium-tier section body (tables and the basis of the premium tier)."""
    if not results:
        return "(the premium sweep was not run in this regeneration: `--groups premium`)"
    w = results[0]["premium_basis"]
    t = results[0]["tiers"][0]
    head = (
        f"The premium tier's TTFT is {TTFT_FACTOR:g} × the TP-2 prefill of the code trace's "
        f"mean prompt ({w['mean_prompt']:.0f} tokens): {t['ttft_ms']:.1f} ms. On the profile "
        f"that prompt alone takes {w['tp1_prefill_ms']:.1f} ms at TP 1 (a replica cannot "
        f"meet the target even idle), {w['tp2_prefill_ms']:.1f} ms at TP 2 and "
        f"{w['tp4_prefill_ms']:.1f} ms at TP 4 (`bind_tp` {t['bind_tp']}: room for a short "
        "wait). Shorter prompts meet it in DP; longer ones need TP. Its TPOT is the relaxed "
        "tier's: it differs by its TTFT only, which is what binding buys. Relaxed and "
        "background are the `apps` workload's "
        f"(`{results[0]['workload_flags']}`). Cells: goodput req/s (premium attainment); "
        "ratios are goodput over the same layout with binding off."
    )
    return head + "\n\n" + verdict(results) + "\n\n" + "\n".join(table(r) for r in results)


def verdict(results: list[dict]) -> str:
    """Binding's ratios over off per layout and pool size, against issue 32's targets."""
    lines = [
        "| layout, pool | cost / off per load | points ≥ 1.0 (unrounded) "
        "| premium attainment higher "
        "with cost | always / off per load |",
        "|---|---|---|---|---|",
    ]
    for layout, name in (("dp", "DP replicas"), ("nitsum", "adaptive Nitsum")):
        for res in results:
            pts = res["points"]
            cost = [p["over_off"][f"{layout}-cost"] for p in pts]
            always = [p["over_off"][f"{layout}-always"] for p in pts]
            higher = sum(
                p["runs"][f"{layout}-cost"]["premium_attainment"]
                > p["runs"][f"{layout}-off"]["premium_attainment"]
                for p in pts
            )
            lines.append(
                f"| {name}, {res['devices']} dev | "
                + " / ".join(f"{x:.3f}" for x in cost)
                + f" | {sum(x >= 1.0 for x in cost)} of {len(cost)} | {higher} of "
                f"{len(pts)} | " + " / ".join(f"{x:.2f}" for x in always) + " |"
            )
    return "\n".join(lines)
