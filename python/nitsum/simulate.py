"""`nitsum simulate`: replay a trace through the Rust cluster simulator (`nitsum._core`).

The simulator, policies and JSON shapes are documented in docs/planner.md. This module only
builds the config (profile, tiers, trace, policy) and prints the result summary.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Sequence
from pathlib import Path

EPILOG = """workloads whose tier mix shifts (docs/planner.md, "Workloads"):
  --mix-schedule step:MIX[@AT:MIX]...
      one trace, MIX until AT, then the next MIX; MIX as --mix (one tier may be 'rest');
      AT a fraction of the run (0.5) or trace seconds before rate scaling (1800s), e.g.
      step:strict=0.8,relaxed=0.2@0.5:strict=0.2,relaxed=0.8
  --mix-schedule sine:TIER=LO..HI,OTHER=SHARE,...,LAST=rest[:period=AT][:phase=F]
      TIER's share swings LO -> HI -> LO once per period (default: the whole run); the
      other tiers keep their shares, 'rest' takes the remainder, e.g.
      sine:strict=0.1..0.8,background=0.1,relaxed=rest
  --tier-source TIER=TRACE[:scale=K][:offset=AT][:keep=F]   (repeat; replaces --trace)
      TIER's requests come from TRACE read as a cycle: started AT into it (wrapping),
      K times faster, each request kept with probability F; the run lasts the shortest
      cycle (or --duration), e.g.
      --tier-source strict=azure-code --tier-source relaxed=azure-conv:offset=0.5 \\
      --tier-source background=azure-conv:keep=0.2:offset=0.25
  Background tiers ({"name": "background", "ttft_ms": 0, "tpot_ms": 0, "background": true}
  in --tiers) run on leftover capacity and do not count toward goodput.
"""

POLICIES = ("nitsum", "nitsum-greedy", "nitsum-fixed-tp", "static", "split")


def _policy(name: str, tp: int | None) -> dict:
    if name == "nitsum":
        return {"kind": "nitsum"}
    if name == "split":
        return {"kind": "split"}
    if name == "nitsum-greedy":
        return {"kind": "nitsum_greedy"}
    if tp is None:
        raise ValueError(f"--policy {name} needs --tp")
    return {"kind": "nitsum_fixed_tp" if name == "nitsum-fixed-tp" else "static_tp", "tp": tp}


def load_arrivals(path: str) -> list[dict]:
    """Requests as `{arrival_s, input_len, output_len, tier|None}` sorted by arrival, relative
    to the first. Accepts what `nitsum.bench.traces` loads (Azure CSV, JSONL, named traces)
    and, in any case, a JSON list of such objects.
    """
    p = Path(path)
    if p.suffix == ".json":
        rows = json.loads(p.read_text())
        reqs = [
            {
                "arrival_s": float(r["arrival_s"]),
                "input_len": int(r["input_len"]),
                "output_len": int(r["output_len"]),
                "tier": r.get("tier"),
            }
            for r in rows
        ]
    else:
        from nitsum.bench.traces import load_trace_file

        reqs = [
            {
                "arrival_s": r.arrival_s,
                "input_len": r.input_len,
                "output_len": r.output_len,
                "tier": r.tier,
            }
            for r in load_trace_file(path)
        ]
    reqs.sort(key=lambda r: r["arrival_s"])
    t0 = reqs[0]["arrival_s"] if reqs else 0.0
    for r in reqs:
        r["arrival_s"] -= t0
    return reqs


def assign_tiers(reqs: list[dict], tiers: list[dict], mix: str | None, seed: int) -> None:
    """Give requests without a tier one: by `mix` ("a=0.7,b=0.3", seeded) or the first tier."""
    names = [t["name"] for t in tiers]
    weights = None
    if mix:
        pairs = [kv.split("=", 1) for kv in mix.split(",") if kv]
        unknown = [k for k, _ in pairs if k not in names]
        if unknown:
            raise ValueError(f"--mix names unknown tiers {unknown}; tiers are {names}")
        names, weights = [k for k, _ in pairs], [float(v) for _, v in pairs]
    rng = random.Random(seed)
    for r in reqs:
        if r.get("tier") is None:
            r["tier"] = rng.choices(names, weights)[0] if weights else names[0]


def shifting_requests(
    tiers: list[dict],
    *,
    trace: str | None,
    tier_sources: Sequence[str] = (),
    mix_schedule: str | None = None,
    duration: float | None = None,
    seed: int = 0,
) -> list[dict]:
    """Requests of a shifting-mix workload (per-tier sources or a mix schedule over `trace`)
    before rate scaling, built by the same code as `nitsum bench` (`nitsum.bench.workload`).
    """
    from nitsum.bench.tiers import TierSpec
    from nitsum.bench.workload import WorkloadSpec, build_workload

    if tier_sources and trace:
        raise ValueError("give --trace or --tier-source, not both")
    if not tier_sources and not trace:
        raise ValueError("--mix-schedule needs --trace")
    inf = float("inf")
    specs = [
        TierSpec(
            t["name"], t.get("ttft_ms", inf), t.get("tpot_ms", inf), t.get("background", False)
        )
        for t in tiers
    ]
    spec = WorkloadSpec(
        trace=trace or "",
        duration_s=duration,
        tier_sources=tuple(tier_sources),
        mix_schedule=mix_schedule,
        seed=seed,
    )
    return [
        {
            "arrival_s": r.arrival_s,
            "input_len": r.input_len,
            "output_len": r.output_len,
            "tier": r.tier,
        }
        for r in build_workload(spec, specs).requests
    ]


def build_config(args: argparse.Namespace) -> dict:
    profile = json.loads(Path(args.profile).read_text())
    tiers = json.loads(Path(args.tiers).read_text())
    if isinstance(tiers, dict):  # a router tiers config: {"tiers": [...], ...}
        tiers = tiers["tiers"]
    if args.tier_source or args.mix_schedule:
        if args.mix:
            raise ValueError("--mix does not combine with --mix-schedule or --tier-source")
        reqs = shifting_requests(
            tiers,
            trace=args.trace,
            tier_sources=args.tier_source,
            mix_schedule=args.mix_schedule,
            duration=args.duration,
            seed=args.seed,
        )
    elif args.trace:
        reqs = load_arrivals(args.trace)
        if args.duration is not None:
            reqs = [r for r in reqs if r["arrival_s"] < args.duration]
        assign_tiers(reqs, tiers, args.mix, args.seed)
    else:
        raise ValueError("give --trace or --tier-source")
    for r in reqs:
        r["arrival_s"] /= args.rate_scale
    return {
        "profile": profile,
        "tiers": tiers,
        "devices": args.devices,
        "policy": _policy(args.policy, args.tp),
        "requests": reqs,
        "window_s": args.window,
        "switch_ms": args.switch_ms,
        "target_utilization": args.target_utilization,
        "records": args.records,
        "binding": args.binding,
        "seed": args.seed,
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nitsum simulate",
        description=__doc__,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--profile", required=True, help="profile JSON (docs/profile-schema.md)")
    p.add_argument(
        "--trace", help="azure-code, azure-conv, Azure CSV, JSONL, or JSON arrivals list"
    )
    p.add_argument("--tiers", required=True, help="JSON list of tiers {name, ttft_ms, tpot_ms}")
    p.add_argument("--devices", type=int, default=8)
    p.add_argument("--policy", choices=POLICIES, default="nitsum")
    p.add_argument("--tp", type=int, help="TP level for nitsum-fixed-tp and static")
    p.add_argument("--rate-scale", type=float, default=1.0, help="arrival rate multiplier")
    p.add_argument(
        "--duration",
        type=float,
        help="keep the first DURATION seconds (with --tier-source: the run's length)",
    )
    p.add_argument("--mix", help="tier mix for untiered requests, e.g. strict=0.3,relaxed=0.7")
    p.add_argument(
        "--mix-schedule", help="tier mix changing over the run: step:... or sine:... (below)"
    )
    p.add_argument(
        "--tier-source",
        action="append",
        default=[],
        help="TIER=TRACE[:scale=K][:offset=AT][:keep=F]: one trace per tier (repeat; below)",
    )
    p.add_argument("--window", type=float, default=1.0, help="control window, seconds")
    p.add_argument("--switch-ms", type=float, default=5.0, help="TP switch cost, ms")
    p.add_argument(
        "--target-utilization", type=float, default=0.5, help="planner headroom (1 = none)"
    )
    p.add_argument("--records", action="store_true", help="include per-request records")
    p.add_argument(
        "--binding",
        choices=("cost", "off", "always"),
        default="cost",
        help="tiers with bind_tp: the cost model decides per request (default), bind_tp is "
        "ignored, or every such request is bound in full (docs/planner.md)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write the result JSON here")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.rate_scale <= 0:
        print("error: --rate-scale must be positive", file=sys.stderr)
        return 2
    try:
        from nitsum import _core

        config = build_config(args)
        result = json.loads(_core.simulate(json.dumps(config)))
    except (OSError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    print(
        f"{result['policy']}: {args.devices} devices, {result['requests']} SLO requests over "
        f"{result['duration_s']:.1f} s: goodput {result['goodput_rps']:.2f} req/s, "
        f"attainment {result['attainment']:.3f}, {result['reconfigurations']} reconfigurations"
    )
    for name, t in result["per_tier"].items():
        print(
            f"  {name}: {t['met']}/{t['requests']} met ({t['attainment']:.3f}), "
            f"dropped {t['dropped']}, TTFT p90 {t['ttft_ms']['p90']:.0f} ms, "
            f"TPOT p90 {t['tpot_ms']['p90']:.1f} ms"
        )
    if b := result.get("bindings"):
        print(
            f"  binding ({args.binding}): {b['dp']} dp, {b['prefill']} prefill, {b['full']} full "
            f"decisions, {b['handbacks']} hand-backs"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
