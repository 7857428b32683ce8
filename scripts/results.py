"""Regenerate docs/results.md, its plots and JSON: simulated goodput sweeps (analytic profile).

Goodput vs offered load (rate-scale sweeps) for 8 and 64 devices, policies side by side:
Nitsum, Nitsum without dynamic TP (best fixed level), static TP-k SGLang-like FCFS (best k)
and per-tier Split. Workloads: the Azure code and conversation traces with 50/50 tier mixes
(tiers derived by the paper's method, and the paper's Table 1 tiers), and three workloads
whose tier mix shifts (docs/planner.md). Then the page from scripts/results_template.md.

    /work/main/.venv/bin/python scripts/results.py              # everything, docs/results*
    /work/main/.venv/bin/python scripts/results.py --jobs 4     # the same, 4 processes
    /work/main/.venv/bin/python scripts/results.py --quick --out /tmp/r   # smoke test

The simulator has no randomness: the same inputs and core give the same page.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import results_premium

# NOTE: imports the installed `nitsum` (with its native `_core`), e.g. main's editable venv.
from results_page import choice_vs_greedy, render, summary, table, tiers_table, workloads_table
from results_plots import plot_goodput, plot_ratios, plot_timeline
from results_sim import SIM_DEFAULTS, Point, run_points
from results_sweeps import ROOT, SHIFTING, TRACES, build_sweeps, describe
from results_tiers import derive_tiers

__all__ = ["derive_tiers"]  # scripts/validate_sim.py imports it from here

# Measured with the planner of the time; the page quotes it (a measured time would make every
# regeneration differ).
RUNTIME_NOTE = (
    "about 3 min with `--jobs 2` on the 2-core dev box (Nitsum runs a shadow of every "
    "strategy); `--jobs N` spreads the runs"
)


DEFAULT_PROFILE = "profiles/h100-llama3-8b-analytic.json"


def _rounded(x: object) -> object:
    """`x` with floats rounded to 4 decimals (smaller JSON, same tables)."""
    if isinstance(x, float):
        return round(x, 4)
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_rounded(v) for v in x]
    return x


def _git(*argv: str) -> str:
    try:
        return subprocess.run(
            ["git", "-C", str(ROOT), *argv], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default=DEFAULT_PROFILE)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "results", help="plots, JSON")
    ap.add_argument("--page", type=Path, help="default: docs/results.md, or OUT/results.md")
    ap.add_argument("--ttft-factor", type=float, default=3.0)
    ap.add_argument("--tpot-factor", type=float, default=1.5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--duration", type=float, help="keep the first DURATION trace seconds")
    ap.add_argument("--devices", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--traces", nargs="+", default=list(TRACES), choices=list(TRACES))
    ap.add_argument(
        "--groups",
        nargs="+",
        default=["derived", "table1", "shifting", "premium"],
        choices=["derived", "table1", "shifting", "premium"],
        help="which sweeps to run",
    )
    ap.add_argument("--jobs", type=int, default=1, help="processes (results do not change)")
    ap.add_argument("--quick", action="store_true", help="smoke test: 8 devices, 2 rates")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    if args.quick:
        args.devices = [8]
    default_out = args.out.resolve() == (ROOT / "docs" / "results").resolve()
    page = args.page or (ROOT / "docs" / "results.md" if default_out else args.out / "results.md")
    profile = json.loads((ROOT / args.profile).read_text())
    args.out.mkdir(parents=True, exist_ok=True)
    sweeps, tier_rows = build_sweeps(profile, args)
    results = {s["key"]: describe(s, profile, args) for s in sweeps}
    points = [
        Point(
            s["key"],
            k,
            profile,
            s["tiers"],
            [dict(r, arrival_s=r["arrival_s"] / k) for r in s["reqs"]],
            s["devices"],
            keep_timeline=k == s["timeline"],
        )
        for s in sweeps
        for k in s["scales"]
    ]

    def done(p: Point, res: dict) -> None:
        print(
            f"{p.sweep} x{p.rate_scale:g}: {res['offered_rps']:.1f} req/s offered; "
            + ", ".join(f"{n} {r['goodput_rps']:.1f}" for n, r in res["runs"].items())
            + f" ({res['wall_s']:.1f} s)",
            flush=True,
        )

    timelines = []
    for p, res in run_points(points, args.jobs, done):
        res.pop("wall_s")  # printed above; kept out of the JSON so regenerations compare
        results[p.sweep]["points"].append(res)
        if p.keep_timeline:
            timelines.append((p, res))
    for key, res in results.items():
        (args.out / f"sim-{key}.json").write_text(json.dumps(_rounded(res), indent=1) + "\n")
    groups: dict[str, list[dict]] = {}
    for res in results.values():
        groups.setdefault(res["group"], []).append(res)
    names = {"derived": "goodput.png", "table1": "goodput-table1.png"}
    for group, rs in groups.items():
        if group == "shifting":  # 8 and 64 devices of one workload side by side
            rs = sorted(rs, key=lambda r: list(SHIFTING).index(r["workload"]))
        plot_goodput(rs, args.out / names.get(group, "goodput-shifting.png"), ncols=2)
    titles = {"derived": "50/50, derived tiers", "table1": "50/50, Table 1 tiers"}
    plot_ratios(
        {titles.get(g, "shifting mixes"): rs for g, rs in groups.items()}, args.out / "ratio.png"
    )
    img = Path(os.path.relpath(args.out, page.parent)).as_posix()
    tl_md = []
    for p, res in timelines:
        name = f"timeline-{p.sweep}.png"
        arrivals = [(r["arrival_s"], r["tier"]) for r in p.reqs]
        title = f"{p.sweep} x{p.rate_scale:g}"
        plot_timeline(
            res["runs"]["nitsum"]["timeline"], arrivals, res["duration_s"], title, args.out / name
        )
        tl_md.append(f"![plan timeline, {title}]({img}/{name})")
    fields = _page_fields(args, profile, groups, tier_rows, tl_md)
    fields["premium"] = results_premium.section(_premium(profile, args))
    text = render(fields).replace("](results/", f"]({img}/")
    page.write_text(text)
    print(f"wrote {page} and {args.out}/ in {time.perf_counter() - t_start:.0f} s")
    return 0


def _premium(profile: dict, args: argparse.Namespace) -> list[dict]:
    """Run the premium-tier sweep (binding off / cost / always), write its JSON."""
    if "premium" not in args.groups:
        return []
    sweeps = results_premium.build(profile, args)
    tasks = [(profile, s, k) for s in sweeps for k in s["scales"]]
    out = {s["key"]: results_premium.describe(s, profile, args) for s in sweeps}
    keys = [s["key"] for s in sweeps for _ in s["scales"]]
    with ProcessPoolExecutor(max(args.jobs, 1)) as pool:
        for key, res in zip(keys, pool.map(results_premium.run_point, tasks), strict=True):
            r = res["runs"]
            print(
                f"{key} x{res['rate_scale']:g}: {res['offered_rps']:.1f} req/s; "
                + ", ".join(f"{n} {x['goodput_rps']:.1f}" for n, x in r.items())
                + f" ({res.pop('wall_s'):.1f} s)",
                flush=True,
            )
            out[key]["points"].append(res)
    for key, res in out.items():
        (args.out / f"sim-{key}.json").write_text(json.dumps(_rounded(res), indent=1) + "\n")
    return list(out.values())


def _page_fields(
    args: argparse.Namespace, profile: dict, groups: dict, tier_rows: list, tl_md: list
) -> dict[str, str]:
    a = profile.get("assumptions", {})
    scaling = profile.get("scaling")  # nitsum.profiling.scaled: TP 1 measured, TP > 1 scaled
    if scaling is not None:
        gpu = scaling.get("gpu", {})
        note = (
            f"{profile.get('model')}, {profile.get('dtype')}: TP 1 MEASURED on "
            f"{profile.get('device')} ({profile.get('date')}), TP > 1 scaled from it by the "
            f"analytic model ({gpu.get('name')}, all-reduce at {gpu.get('nvlink_gbps')} GB/s)"
        )
        kind = "measured TP-1 profile, scaled to TP > 1"
    elif profile.get("analytic"):
        note = (
            f"{profile.get('model')}, {profile.get('dtype')}, {profile.get('device')}: peak "
            f"{a.get('peak_tflops')} TFLOPs × MFU {a.get('mfu')}, HBM {a.get('hbm_tbps')} TB/s"
            f" × {a.get('hbm_efficiency')}, all-reduce at {a.get('allreduce_gbps')} GB/s"
        )
        kind = "analytic roofline profile"
    else:
        note = f"{profile.get('model')} on {profile.get('device')}: a MEASURED profile"
        kind = "MEASURED profile"
    command = "/work/main/.venv/bin/python scripts/results.py"
    if args.profile != DEFAULT_PROFILE:
        out = args.out.resolve()
        out_arg = out.relative_to(ROOT) if out.is_relative_to(ROOT) else out
        command += f" --profile {args.profile} --out {out_arg}"
    order = ["derived", "table1", "shifting"]
    heads = {
        "derived": "50/50, derived tiers",
        "table1": "50/50, Table 1 tiers",
        "shifting": "Shifting mixes",
    }
    tables = "\n".join(
        f"### {heads[g]}\n\n" + "\n".join(table(r) for r in groups[g]) for g in order if g in groups
    )
    dirty = _git("status", "--porcelain", "--", "scheduler-rs")
    return {
        "profile": args.profile,
        "profile_note": note,
        "profile_kind": kind,
        "runtime_note": RUNTIME_NOTE,
        "command": command,
        "planner_commit": _git("log", "-1", "--format=%h", "--", "scheduler-rs") or "?",
        "dirty_note": ", with uncommitted changes" if dirty else "",
        "summary": summary({heads[g]: groups[g] for g in order if g in groups}),
        "choice_vs_greedy": choice_vs_greedy({heads[g]: groups[g] for g in order if g in groups}),
        "workloads_table": workloads_table(groups.get("shifting", [])),
        "sim_defaults": ", ".join(f"`{k}` {v:g}" for k, v in SIM_DEFAULTS.items()),
        "ttft_factor": f"{args.ttft_factor:g}",
        "tpot_factor": f"{args.tpot_factor:g}",
        "tiers_table": tiers_table(tier_rows),
        "tables": tables,
        "timelines": "\n\n".join(tl_md) or "(no shifting-mix run at 8 devices in this run)",
    }


if __name__ == "__main__":
    raise SystemExit(main())
