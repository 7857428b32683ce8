"""The runs of one `nitsum bench` invocation: a sweep of rate scales over a trace, or of
concurrencies for a closed loop (closed_loop.py), and each run replayed and summarized."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from tqdm import tqdm

from nitsum.bench import closed_loop
from nitsum.bench.planlog import save_plan_log
from nitsum.bench.plot import plot_plan_timeline
from nitsum.bench.replay import ReplayConfig, run_replay
from nitsum.bench.report import format_summary, summarize
from nitsum.bench.tiers import TierSpec
from nitsum.bench.traces import TraceRequest
from nitsum.bench.workload import Workload, run_requests

Run = tuple[dict[str, Any], list[TraceRequest], float | None, ReplayConfig | None]


def run_name(key: dict[str, Any]) -> str:
    """`rate x2` / `concurrency 16`: how progress and summaries name a run."""
    if "max_concurrency" in key:
        return f"concurrency {key['max_concurrency']}"
    return f"rate x{key['rate_scale']:g}"


def run_one(
    args: argparse.Namespace,
    reqs: list[TraceRequest],
    duration: float | None,
    tiers: list[TierSpec],
    cfg: ReplayConfig,
    key: dict[str, Any],
) -> dict[str, Any]:
    """One run of the sweep; `key` names it (`rate_scale`, or `max_concurrency` for a closed
    loop)."""
    name = run_name(key)
    with tqdm(total=len(reqs), desc=name, disable=args.no_progress, file=sys.stderr) as bar:
        result = run_replay(reqs, cfg, on_done=lambda _: bar.update())
    summary = summarize(result.records, tiers, duration or max(result.wall_s, 1e-9))
    print(f"== {name}\n{format_summary(summary)}")
    run: dict[str, Any] = key | {"wall_s": result.wall_s, "summary": summary}
    if result.plan_log:
        # NOTE: one timeline per run: `-x2` for a rate scale, `-c16` for a concurrency.
        tag = (
            f"c{key['max_concurrency']}" if "max_concurrency" in key else f"x{key['rate_scale']:g}"
        )
        stem = args.out.with_suffix("") if args.out else Path("bench")
        path = Path(f"{stem}.plan-{tag}.jsonl")
        save_plan_log(path, result.plan_log)
        run["plan_log"] = str(path)
        if args.plot_plan:
            single = len(args.rate_scale) == 1 and len(args.max_concurrency or [1]) == 1
            plot = (
                args.plot_plan
                if single
                else args.plot_plan.with_stem(f"{args.plot_plan.stem}-{tag}")
            )
            plot_plan_timeline(result.plan_log, plot)
    run["records"] = [r.to_json(args.chunk_times) for r in result.records]
    return run


def sweep(
    args: argparse.Namespace,
    w: Workload,
    closed: list[closed_loop.ClosedRun] | None,
    base: ReplayConfig | None,
) -> list[Run]:
    """Each run: its key, requests, trace duration (None: the wall time) and replay config
    (None without `base`, for a dry run). A rate sweep, or a closed loop's concurrencies."""
    if closed is not None:
        out: list[Run] = []
        for i, c in enumerate(closed):
            reqs, cfg = closed_loop.run_plan(w, c, i, base or ReplayConfig(url=""))
            out.append(({"max_concurrency": c.concurrency}, reqs, None, cfg if base else None))
        return out
    return [
        ({"rate_scale": k}, *run_requests(w, k, args.max_requests), base) for k in args.rate_scale
    ]
