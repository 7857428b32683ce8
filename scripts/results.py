"""Regenerate the simulated results in docs/results/ (analytic H100 profile: estimates).

Goodput vs offered request rate (a rate-scale sweep) on the Azure code and conversation
traces for 8 and 64 devices, policies side by side: Nitsum, Nitsum without dynamic TP (best
fixed level), static TP-k SGLang-like FCFS (best k) and per-tier Split. SLO tiers follow the
paper's method (§4, "SLO setups") applied to the profile; see `derive_tiers`.

    /work/main/.venv/bin/python scripts/results.py            # full sweep, ~5-10 min on 1 core
    /work/main/.venv/bin/python scripts/results.py --quick    # 2 rates, 8 devices, smoke test

Writes `OUT/sim-<trace>-<N>dev.json`, `OUT/goodput-<trace>-<N>dev.png`, `OUT/goodput.png`
(all four panels) and `OUT/tables.md`. The simulator has no randomness: the same inputs give
the same numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

# NOTE: imports the installed `nitsum` (with its native `_core`), e.g. main's editable venv.
from nitsum import _core
from nitsum.simulate import assign_tiers, load_arrivals

ROOT = Path(__file__).resolve().parents[1]

TRACE_DIR = ROOT.parent / "shared" / "traces"
TRACES = {
    "code": "AzureLLMInferenceTrace_code.csv",
    "conv": "AzureLLMInferenceTrace_conv.csv",
}
# Rate scales per (trace, devices): from well below saturation to ~2x overload. The whole
# trace (about an hour) is replayed, so high scales still leave >= ~10 s of arrivals.
RATE_SCALES = {
    ("code", 8): [1, 2, 5, 10, 20, 40, 60],
    ("conv", 8): [5, 10, 15, 20, 25, 30, 40],
    ("code", 64): [8, 16, 40, 80, 160, 320, 480],
    ("conv", 64): [40, 80, 120, 160, 200, 240, 320],
}
QUICK_SCALES = {("code", 8): [10, 60], ("conv", 8): [10, 30]}


# ---- profile lookups (the semantics of scheduler-rs/src/profile.rs, docs/planner.md) ----


def _interp(xs: list[float], ys: list[float], x: float) -> float:
    """Piecewise linear; holds the first value below the first point and extrapolates the
    last segment past the last point."""
    if x <= xs[0] or len(xs) == 1:
        return ys[0]
    for i in range(1, len(xs)):
        if x <= xs[i] or i == len(xs) - 1:
            x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    raise AssertionError


def prefill_ms(profile: dict, tp: int, tokens: float) -> float:
    pts = sorted(profile["prefill"][str(tp)], key=lambda p: p["tokens"])
    return _interp([p["tokens"] for p in pts], [p["ms"] for p in pts], tokens)


def prefill_fixed_ms(profile: dict, tp: int) -> float:
    """The prefill curve extrapolated to 0 tokens, clamped to [0, first point]."""
    pts = sorted(profile["prefill"][str(tp)], key=lambda p: p["tokens"])
    if len(pts) < 2:
        return pts[0]["ms"]
    (x0, y0), (x1, y1) = (pts[0]["tokens"], pts[0]["ms"]), (pts[1]["tokens"], pts[1]["ms"])
    return min(max(y0 - (y1 - y0) / (x1 - x0) * x0, 0.0), y0)


def decode_ms(profile: dict, tp: int, batch: float, context: float) -> float:
    """Linear in batch within each profiled context row, linear between rows."""
    rows: dict[int, list[dict]] = {}
    for p in profile["decode"][str(tp)]:
        rows.setdefault(p["context"], []).append(p)
    ctxs = sorted(rows)
    per_row = []
    for c in ctxs:
        pts = sorted(rows[c], key=lambda p: p["batch"])
        per_row.append(_interp([p["batch"] for p in pts], [p["ms"] for p in pts], batch))
    return _interp([float(c) for c in ctxs], per_row, context)


def max_batch(profile: dict, tp: int) -> int:
    return max(p["batch"] for p in profile["decode"][str(tp)])


def derive_tiers(
    profile: dict,
    mean_in: float,
    mean_out: float,
    ttft_factor: float,
    tpot_factor: float,
    big_batch: int = 128,
) -> tuple[list[dict], dict]:
    """SLO tiers by the paper's method (§4 "SLO setups"), from the profile instead of a run.

    At the smallest profiled TP level, with the trace's mean prompt L and output O (decode
    context c = L + O/2):
    - strict (batch 1): TTFT = prefill_ms(L); TPOT = decode_ms(batch 1, c).
    - relaxed (batch `big_batch`, 128 in the paper, capped at the profile's largest batch):
      TPOT = decode_ms(batch B, c); TTFT = the iteration that prefills one prompt while B
      requests decode: decode_ms(B, c) + prefill_ms(L) - prefill_fixed_ms (one weight read).
    Then TTFT × `ttft_factor`, TPOT × `tpot_factor`. Returns (tiers, the unscaled bases).
    """
    tp = min(profile["tp_levels"])
    ctx = mean_in + mean_out / 2
    b = min(big_batch, max_batch(profile, tp))
    base = {
        "tp": tp,
        "mean_input": round(mean_in, 1),
        "mean_output": round(mean_out, 1),
        "context": round(ctx, 1),
        "big_batch": b,
        "strict_ttft_ms": prefill_ms(profile, tp, mean_in),
        "strict_tpot_ms": decode_ms(profile, tp, 1, ctx),
        "relaxed_ttft_ms": decode_ms(profile, tp, b, ctx)
        + prefill_ms(profile, tp, mean_in)
        - prefill_fixed_ms(profile, tp),
        "relaxed_tpot_ms": decode_ms(profile, tp, b, ctx),
    }
    tiers = [
        {
            "name": name,
            "ttft_ms": round(base[f"{name}_ttft_ms"] * ttft_factor, 2),
            "tpot_ms": round(base[f"{name}_tpot_ms"] * tpot_factor, 2),
        }
        for name in ("strict", "relaxed")
    ]
    base = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in base.items()}
    return tiers, base


# ---- simulation ----


def _policies(levels: list[int], devices: int) -> list[tuple[str, dict]]:
    ok = [t for t in levels if t <= devices]
    out: list[tuple[str, dict]] = [("nitsum", {"kind": "nitsum"})]
    out += [(f"fixed-tp{t}", {"kind": "nitsum_fixed_tp", "tp": t}) for t in ok]
    out += [(f"static-tp{t}", {"kind": "static_tp", "tp": t}) for t in ok]
    out.append(("split", {"kind": "split"}))
    return out


def simulate(
    profile: dict, tiers: list[dict], reqs: list[dict], devices: int, policy: dict
) -> dict[str, Any]:
    """One `nitsum simulate` run (the CLI's config with its defaults), without records."""
    cfg = {
        "profile": profile,
        "tiers": tiers,
        "devices": devices,
        "policy": policy,
        "requests": reqs,
        "window_s": 1.0,
        "switch_ms": 5.0,
        "target_utilization": 0.5,
        "records": False,
        "seed": 0,
    }
    r = json.loads(_core.simulate(json.dumps(cfg)))
    return {
        "goodput_rps": r["goodput_rps"],
        "attainment": r["attainment"],
        "duration_s": r["duration_s"],
        "requests": r["requests"],
        "reconfigurations": r["reconfigurations"],
        "devices_moved": r.get("devices_moved"),
        "per_tier": {
            name: {
                "attainment": t["attainment"],
                "goodput_rps": t["goodput_rps"],
                "dropped": t["dropped"],
                "ttft_p50_ms": t["ttft_ms"].get("p50"),
                "ttft_p90_ms": t["ttft_ms"].get("p90"),
                "tpot_p50_ms": t["tpot_ms"].get("p50"),
                "tpot_p90_ms": t["tpot_ms"].get("p90"),
            }
            for name, t in r["per_tier"].items()
        },
    }


def best_of(runs: dict[str, dict], prefix: str) -> tuple[str, dict]:
    """The run with the highest goodput among names starting with `prefix` (ties: lower TP)."""
    names = [n for n in runs if n.startswith(prefix)]
    name = max(names, key=lambda n: (runs[n]["goodput_rps"], -int(n.rsplit("tp", 1)[1])))
    return name, runs[name]


def sweep(
    trace: str,
    devices: int,
    scales: list[float],
    profile: dict,
    args: argparse.Namespace,
) -> dict[str, Any]:
    base_reqs = load_arrivals(str(TRACE_DIR / TRACES[trace]))
    if args.duration:
        base_reqs = [r for r in base_reqs if r["arrival_s"] < args.duration]
    mean_in = sum(r["input_len"] for r in base_reqs) / len(base_reqs)
    mean_out = sum(r["output_len"] for r in base_reqs) / len(base_reqs)
    tiers, base = derive_tiers(profile, mean_in, mean_out, args.ttft_factor, args.tpot_factor)
    if args.tiers:  # given tiers replace the derived ones (the bases are still reported)
        tiers = json.loads(Path(args.tiers).read_text())
    assign_tiers(base_reqs, tiers, args.mix, args.seed)
    points = []
    for k in scales:
        reqs = [dict(r, arrival_s=r["arrival_s"] / k) for r in base_reqs]
        t0 = time.perf_counter()
        runs = {
            name: simulate(profile, tiers, reqs, devices, pol)
            for name, pol in _policies(profile["tp_levels"], devices)
        }
        dur = runs["nitsum"]["duration_s"]
        fixed_name, _ = best_of(runs, "fixed-tp")
        static_name, _ = best_of(runs, "static-tp")
        points.append(
            {
                "rate_scale": k,
                "offered_rps": len(reqs) / dur,
                "duration_s": dur,
                "best_fixed": fixed_name,
                "best_static": static_name,
                "runs": runs,
            }
        )
        print(
            f"{trace} {devices}dev x{k:g}: {len(reqs) / dur:.1f} req/s offered; "
            + ", ".join(f"{n} {r['goodput_rps']:.1f}" for n, r in runs.items())
            + f" ({time.perf_counter() - t0:.1f} s)",
            flush=True,
        )
    cmd = (
        f"nitsum simulate --profile {args.profile} --tiers TIERS.json "
        f"--trace {TRACE_DIR / TRACES[trace]} --rate-scale K --mix {args.mix} "
        f"--devices {devices} --policy P [--tp T] --seed {args.seed}"
        + (f" --duration {args.duration:g}" if args.duration else "")
    )
    return {
        "trace": f"azure-{trace}",
        "devices": devices,
        "profile": args.profile,
        "profile_device": profile.get("device"),
        "profile_model": profile.get("model"),
        "analytic": bool(profile.get("analytic")),
        "requests": len(base_reqs),
        "trace_duration_s": args.duration,
        "mix": args.mix,
        "seed": args.seed,
        "slo_method": {
            "ttft_factor": args.ttft_factor,
            "tpot_factor": args.tpot_factor,
            "unscaled": base,
        },
        "tiers": tiers,
        "tiers_source": args.tiers or "derived (slo_method)",
        "label": args.label,
        "core": _core.__file__,
        "sim_defaults": {"window_s": 1, "switch_ms": 5, "slo_margin": 0.9, "target_util": 0.5},
        "equivalent_cli": cmd,
        "points": points,
    }


# ---- outputs ----

SERIES = (
    ("nitsum", "Nitsum", "tab:red", "o"),
    ("fixed", "Nitsum w/o dynamic TP (best fixed TP)", "tab:orange", "s"),
    ("static", "static TP-k FCFS, SGLang-like (best k)", "tab:blue", "^"),
    ("split", "per-tier Split (best TP per tier)", "tab:green", "v"),
)


def series(res: dict, key: str) -> list[float]:
    out = []
    for p in res["points"]:
        name = {"fixed": p["best_fixed"], "static": p["best_static"]}.get(key, key)
        out.append(p["runs"][name]["goodput_rps"])
    return out


def plot(results: list[dict], path: Path, ncols: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nrows = (len(results) + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 3.5 * nrows), squeeze=False)
    for ax, res in zip(axes.flat, results, strict=False):
        x = [p["offered_rps"] for p in res["points"]]
        ax.plot(x, x, "--", color="gray", lw=0.8, label="offered (ideal)")
        for key, label, color, marker in SERIES:
            ax.plot(x, series(res, key), marker=marker, ms=4, color=color, label=label)
        t = {t["name"]: t for t in res["tiers"]}
        ax.set_title(
            f"{res['trace']}, {res['devices']}x H100 (analytic), Llama-3.1-8B"
            + (f" [{res['label']}]" if res.get("label") else "")
            + "\n"
            f"strict {t['strict']['ttft_ms']:.0f}/{t['strict']['tpot_ms']:.1f} ms, "
            f"relaxed {t['relaxed']['ttft_ms']:.0f}/{t['relaxed']['tpot_ms']:.1f} ms",
            fontsize=8,
        )
        ax.set_xlabel("offered load (req/s)", fontsize=8)
        ax.set_ylabel("goodput (req/s)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(results) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=6, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)


def table(res: dict) -> str:
    t = {t["name"]: t for t in res["tiers"]}
    lines = [
        f"### {res['trace']}, {res['devices']} devices (H100 analytic profile, "
        f"{res['profile_model']})" + (f" [{res['label']}]" if res.get("label") else ""),
        "",
        f"{res['requests']} requests, mix {res['mix']} (seed {res['seed']}); tiers TTFT/TPOT: "
        f"strict {t['strict']['ttft_ms']:.1f}/{t['strict']['tpot_ms']:.2f} ms, "
        f"relaxed {t['relaxed']['ttft_ms']:.1f}/{t['relaxed']['tpot_ms']:.2f} ms. "
        "Goodput in req/s (attainment); best k in brackets.",
        "",
        "| rate scale | offered req/s | Nitsum | w/o dyn. TP [k] | static FCFS [k] | Split "
        "| Nitsum / best baseline |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in res["points"]:
        r = p["runs"]

        def cell(name: str, k: bool = False, r: dict = r) -> str:
            s = f"{r[name]['goodput_rps']:.1f} ({r[name]['attainment']:.2f})"
            return s + (f" [{name.rsplit('tp', 1)[1]}]" if k else "")

        best = max(
            r[p["best_fixed"]]["goodput_rps"],
            r[p["best_static"]]["goodput_rps"],
            r["split"]["goodput_rps"],
        )
        ratio = r["nitsum"]["goodput_rps"] / best if best > 0 else float("nan")
        lines.append(
            f"| {p['rate_scale']:g} | {p['offered_rps']:.1f} | {cell('nitsum')} | "
            f"{cell(p['best_fixed'], True)} | {cell(p['best_static'], True)} | "
            f"{cell('split')} | {ratio:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default="profiles/h100-llama3-8b-analytic.json")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "results")
    ap.add_argument("--ttft-factor", type=float, default=3.0)
    ap.add_argument("--tpot-factor", type=float, default=1.5)
    ap.add_argument("--label", help="a note for titles and tables (e.g. a patched core)")
    ap.add_argument("--tiers", help="JSON tiers file instead of the derived tiers")
    ap.add_argument("--mix", default="strict=0.5,relaxed=0.5")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--duration", type=float, help="keep the first DURATION trace seconds")
    ap.add_argument("--devices", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--traces", nargs="+", default=["code", "conv"], choices=list(TRACES))
    ap.add_argument("--quick", action="store_true", help="smoke test: 8 devices, 2 rates")
    args = ap.parse_args(argv)
    profile = json.loads((ROOT / args.profile).read_text())
    if not profile.get("analytic"):
        print("note: profile is measured, labels below still say analytic", file=sys.stderr)
    scales = QUICK_SCALES if args.quick else RATE_SCALES
    devices = [8] if args.quick else args.devices
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for n in devices:
        for trace in args.traces:
            res = sweep(trace, n, scales[(trace, n)], profile, args)
            results.append(res)
            (args.out / f"sim-{trace}-{n}dev.json").write_text(json.dumps(res, indent=1) + "\n")
            plot([res], args.out / f"goodput-{trace}-{n}dev.png", 1)
    plot(results, args.out / "goodput.png", 2)
    md = "\n".join(table(r) for r in results)
    (args.out / "tables.md").write_text(
        "<!-- generated by scripts/results.py; do not edit -->\n\n" + md
    )
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
