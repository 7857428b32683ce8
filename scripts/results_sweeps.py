"""The sweeps of results.py: workloads, tiers, rate scales, and each sweep's JSON header.

50/50 tier mixes on the Azure code and conversation traces (derived tiers and the paper's
Table 1 tiers) and three workloads whose tier mix shifts, built by the same code as `nitsum
simulate` / `nitsum bench` (`nitsum.simulate.shifting_requests`).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from nitsum.simulate import assign_tiers, load_arrivals, shifting_requests
from results_sim import SIM_DEFAULTS
from results_tiers import BACKGROUND_TIER, TABLE1_TIERS, derive_tiers, mean_lengths

ROOT = Path(__file__).resolve().parents[1]
# NOTE: as `nitsum.bench.traces` finds them: $NITSUM_TRACE_DIR, else next to the checkout.
TRACE_DIR = Path(os.environ.get("NITSUM_TRACE_DIR") or ROOT.parent / "shared" / "traces")
TRACES = {"code": "AzureLLMInferenceTrace_code.csv", "conv": "AzureLLMInferenceTrace_conv.csv"}
MIX50 = "strict=0.5,relaxed=0.5"
# Rate scales per (trace, devices): from well below saturation to ~2x overload. The whole
# trace (about an hour) is replayed, so high scales still leave >= ~10 s of arrivals.
RATE_SCALES = {
    ("code", 8): [1, 2, 5, 10, 20, 40, 60],
    ("conv", 8): [5, 10, 15, 20, 25, 30, 40],
    ("code", 64): [8, 16, 40, 80, 160, 320, 480],
    ("conv", 64): [40, 80, 120, 160, 200, 240, 320],
}
# Shifting-mix workloads: `nitsum simulate` flags, the trace each tier's SLO is derived from,
# rate scales per pool size, and the rate scale of the plan-timeline run (8 devices).
SHIFTING: dict[str, dict] = {
    "apps": {
        "sources": (
            "strict=azure-code",
            "relaxed=azure-conv:offset=0.5",
            "background=azure-conv:offset=0.25:keep=0.2",
        ),
        "tiers_from": {"strict": "code", "relaxed": "conv"},
        "scales": {8: [2, 4, 8, 12, 16], 64: [16, 32, 64, 96, 128]},
        "timeline": 8,
    },
    "conv-step": {
        "schedule": "step:strict=0.8,relaxed=0.2@0.5:strict=0.2,relaxed=0.8",
        "tiers_from": {"strict": "conv", "relaxed": "conv"},
        "scales": {8: [5, 10, 15, 20, 30], 64: [40, 80, 120, 160, 240]},
        "timeline": 20,
    },
    "conv-sine": {
        "schedule": "sine:strict=0.1..0.8,background=0.1,relaxed=rest",
        "tiers_from": {"strict": "conv", "relaxed": "conv"},
        "scales": {8: [5, 10, 15, 20, 30], 64: [40, 80, 120, 160, 240]},
        "timeline": 20,
    },
}
QUICK = {("code", 8): [10, 60], ("conv", 8): [10, 30]}


def _flags(w: dict) -> str:
    if "sources" in w:
        return " ".join(f"`--tier-source {s}`" for s in w["sources"])
    return f"`--trace azure-conv --mix-schedule {w['schedule']}`"


def _tiers_line(tiers: list[dict]) -> str:
    return ", ".join(
        f"{t['name']} (no SLO)"
        if t.get("background")
        else f"{t['name']} {t['ttft_ms']:.1f}/{t['tpot_ms']:.2f} ms"
        for t in tiers
    )


def build_sweeps(profile: dict, args: argparse.Namespace) -> tuple[list[dict], list[tuple]]:
    """Every sweep as a dict (requests unscaled, tiers given) and the derived-tier rows."""
    base = {t: load_arrivals(str(TRACE_DIR / f)) for t, f in TRACES.items()}
    if args.duration:
        base = {t: [r for r in rs if r["arrival_s"] < args.duration] for t, rs in base.items()}
    derived = {}
    for t, rs in base.items():
        derived[t] = derive_tiers(profile, *mean_lengths(rs), args.ttft_factor, args.tpot_factor)
    rows = [(f"azure-{t}", {x["name"]: x for x in d[0]}, d[1]) for t, d in derived.items()]
    sweeps = []
    for n in args.devices:
        for group, label in (("derived", ""), ("table1", "table1-")):
            if group not in args.groups:
                continue
            for t in args.traces:
                tiers = derived[t][0] if group == "derived" else TABLE1_TIERS
                reqs = [dict(r) for r in base[t]]
                assign_tiers(reqs, tiers, MIX50, args.seed)
                scales = (QUICK if args.quick else RATE_SCALES).get((t, n))
                sweeps.append(
                    {
                        "key": f"{label}{t}-{n}dev",
                        "group": group,
                        "workload": f"azure-{t} 50/50",
                        "workload_flags": f"`--trace azure-{t} --mix {MIX50}`",
                        "devices": n,
                        "tiers": tiers,
                        "reqs": reqs,
                        "scales": scales,
                        "timeline": None,
                    }
                )
        for name, w in SHIFTING.items() if "shifting" in args.groups else ():
            tiers = [
                next(x for x in derived[src][0] if x["name"] == tier)
                for tier, src in w["tiers_from"].items()
            ]
            if "background" in (w.get("schedule", "") + " ".join(w.get("sources", ()))):
                tiers.append(BACKGROUND_TIER)
            reqs = shifting_requests(
                tiers,
                trace=None if "sources" in w else "azure-conv",
                tier_sources=w.get("sources", ()),
                mix_schedule=w.get("schedule"),
                duration=args.duration,
                seed=args.seed,
            )
            scales = sorted({w["scales"][n][0], w["timeline"]}) if args.quick else w["scales"][n]
            sweeps.append(
                {
                    "key": f"{name}-{n}dev",
                    "group": "shifting",
                    "workload": name,
                    "workload_flags": _flags(w),
                    "devices": n,
                    "tiers": tiers,
                    "reqs": reqs,
                    "scales": scales,
                    "timeline": w["timeline"] if n == 8 else None,
                }
            )
    return [s for s in sweeps if s["scales"]], rows


def describe(s: dict, profile: dict, args: argparse.Namespace) -> dict:
    """The sweep's JSON header (what the page and a reader need besides the points)."""
    counts = {t["name"]: 0 for t in s["tiers"]}
    for r in s["reqs"]:
        counts[r["tier"]] += 1
    suffix = " (Table 1 tiers)" if s["group"] == "table1" else ""
    short = f"{s['workload'].removesuffix(' 50/50')} {s['devices']} dev"
    return {
        "key": s["key"],
        "group": s["group"],
        "workload": s["workload"],
        "workload_flags": s["workload_flags"],
        "devices": s["devices"],
        "short": short,
        "title": f"{s['workload']}, {s['devices']} devices{suffix}",
        "workload_line": s["workload_flags"].replace("`", "") + f", seed {args.seed}",
        "requests": len(s["reqs"]),
        "tier_shares": {k: v / len(s["reqs"]) for k, v in counts.items()},
        "tiers": s["tiers"],
        "tiers_line": _tiers_line(s["tiers"]),
        "profile": args.profile,
        "profile_model": profile.get("model"),
        "analytic": bool(profile.get("analytic")),
        "seed": args.seed,
        "slo_method": {"ttft_factor": args.ttft_factor, "tpot_factor": args.tpot_factor},
        "sim": SIM_DEFAULTS,
        "trace_duration_s": args.duration,
        "equivalent_cli": f"nitsum simulate --profile {args.profile} --tiers TIERS.json "
        + s["workload_flags"].replace("`", "")
        + f" --rate-scale K --devices {s['devices']} --policy P [--tp T] --seed {args.seed}"
        + (f" --duration {args.duration:g}" if args.duration else ""),
        "points": [],
    }
