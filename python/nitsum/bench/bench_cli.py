"""`nitsum bench`: replay a trace against an OpenAI-compatible server and report goodput.

    nitsum bench --url http://127.0.0.1:8000 --trace azure-conv --start 600 --duration 600 \\
        --input-scale 0.5 --max-context 2048 --tiers tiers.toml \\
        --tier-mix strict=0.3,relaxed=0.5,background=0.2 --rate-scale 0.5 1 2 \\
        --out results.json --plot goodput.png --plan-url http://127.0.0.1:8000/admin/plan

Workloads whose tier mix shifts (same syntax as `nitsum simulate`, docs/planner.md):
`--mix-schedule step:strict=0.8,relaxed=0.2@0.5:strict=0.2,relaxed=0.8` or
`--mix-schedule sine:strict=0.1..0.8,background=0.1,relaxed=rest` over one `--trace`, or
one trace per tier: `--tier-source strict=azure-code --tier-source relaxed=azure-conv:offset=0.5`.

A closed loop shaped like `vllm bench serve --dataset-name random` (closed_loop.py):
`--trace random --random-input-len 1024 --random-output-len 128 --max-concurrency 1 16 64`.

Without a server: `--dry-run` prints what would be sent; `--compare A.json B.json --plot P`
plots earlier results (`--plot-tiers P.svg`: per-tier goodput, attainment and p90 latency vs
their SLOs); `--plan-log F --plot-plan P` plots a saved plan timeline.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from nitsum.bench import closed_loop, pyplot
from nitsum.bench.bursty import BurstySpec, UniformLengths
from nitsum.bench.mixes import tier_shares
from nitsum.bench.planlog import load_plan_log
from nitsum.bench.plot import load_results, plot_goodput_vs_rate, plot_plan_timeline
from nitsum.bench.replay import ReplayConfig, completions_url
from nitsum.bench.sweep import run_name, run_one, sweep
from nitsum.bench.tier_plot import plot_tiers
from nitsum.bench.tiers import DEFAULT_TIERS, TierSpec, load_tiers_file, parse_tier_arg
from nitsum.bench.traces import TraceError
from nitsum.bench.workload import Workload, WorkloadSpec, build_workload


def _id_range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition(":")
    if not hi or not 0 <= int(lo) < int(hi):
        raise argparse.ArgumentTypeError(f"expected LO:HI with 0 <= LO < HI, got {text!r}")
    return int(lo), int(hi)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends defaults only where there is one worth showing."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False, []) or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nitsum bench",
        description=__doc__.split("\n")[0],
        formatter_class=_HelpFormatter,
    )
    p.add_argument("--url", help="server base URL (or the full /v1/completions URL)")
    p.add_argument("--model", help="model field; default: first id of GET /v1/models")
    p.add_argument(
        "--api-key",
        default=os.environ.get("NITSUM_API_KEY"),
        help="Bearer key (default: $NITSUM_API_KEY)",
    )
    g = p.add_argument_group("trace")
    g.add_argument(
        "--trace",
        help="azure-code|azure-conv|PATH.csv|PATH.jsonl|bursty|random (default azure-conv)",
    )
    g.add_argument("--trace-dir", type=Path, help="where azure-* live (default ../shared/traces)")
    g.add_argument("--start", type=float, default=0.0, help="window start in trace seconds")
    g.add_argument("--duration", type=float, help="window length in trace seconds")
    g.add_argument("--rate-scale", type=float, nargs="+", default=[1.0], help="one run per value")
    g.add_argument("--max-requests", type=int, help="cap on requests per run (the first N)")
    g.add_argument("--input-scale", type=float, default=1.0, help="multiply prompt lengths")
    g.add_argument("--output-scale", type=float, default=1.0, help="multiply output lengths")
    g.add_argument("--max-context", type=int, help="clamp input+output to this many tokens")
    g.add_argument("--seed", type=int, default=0, help="bursty arrivals, tier mix, prompts")
    b = p.add_argument_group("bursty trace (--trace bursty)")
    b.add_argument("--bursty-low-rate", type=float, default=3.0, help="req/s in low phases")
    b.add_argument("--bursty-high-rate", type=float, default=20.0, help="req/s in bursts")
    b.add_argument("--bursty-period", type=float, default=20.0, help="seconds per low+high")
    b.add_argument("--bursty-burst-fraction", type=float, default=0.5, help="of each period")
    b.add_argument("--bursty-duration", type=float, default=120.0, help="seconds")
    lengths = UniformLengths.parse
    b.add_argument("--bursty-input", type=lengths, default="128:4000", help="prompt LO:HI")
    b.add_argument("--bursty-output", type=lengths, default="64:512", help="output LO:HI")
    closed_loop.add_arguments(p)
    t = p.add_argument_group("tiers")
    t.add_argument(
        "--tiers",
        action="append",
        default=[],
        help="tiers file (.json/.toml) or NAME:ttft=MS,tpot=MS[,background]; repeatable "
        "(default: the router's default tiers: "
        + ", ".join(
            t.name if t.background else f"{t.name} {t.ttft_ms:g}/{t.tpot_ms:g} ms"
            for t in DEFAULT_TIERS
        )
        + ")",
    )
    t.add_argument("--tier-mix", help="e.g. strict=0.3,relaxed=0.5,background=0.2")
    t.add_argument("--tier-by-length", help="e.g. strict:512,relaxed:2048,background")
    t.add_argument("--default-tier", help="tier of requests without one")
    t.add_argument(
        "--mix-schedule",
        help="mix over time: step:MIX@AT:MIX... or sine:TIER=LO..HI,OTHER=SHARE,LAST=rest"
        "[:period=AT][:phase=F]; AT = fraction of the run (0.5) or seconds (1800s)",
    )
    t.add_argument(
        "--tier-source",
        action="append",
        default=[],
        help="TIER=TRACE[:scale=K][:offset=AT][:keep=F]: one trace per tier, read as a cycle "
        "started AT into it; replaces --trace; repeatable",
    )
    r = p.add_argument_group("replay")
    r.add_argument("--token-ids", type=_id_range, default="1000:20000", help="prompt id LO:HI")
    r.add_argument("--concurrency", type=int, default=256, help="cap on requests in flight")
    r.add_argument("--request-timeout", type=float, default=300.0, help="seconds per request")
    r.add_argument(
        "--timeout",
        type=float,
        help="global seconds per run (default: last arrival + request timeout + 10)",
    )
    r.add_argument("--plan-url", help="poll this /admin/plan every 0.5 s during each run")
    r.add_argument("--dry-run", action="store_true", help="print the workload, send nothing")
    r.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    o = p.add_argument_group("output")
    o.add_argument("--out", type=Path, help="results JSON")
    o.add_argument("--label", help="name of this configuration in plots")
    o.add_argument("--chunk-times", action="store_true", help="keep per-chunk times in --out")
    o.add_argument("--plot", type=Path, help="goodput vs rate PNG")
    o.add_argument("--plot-plan", type=Path, help="plan timeline PNG (needs --plan-url)")
    o.add_argument(
        "--plot-tiers",
        type=Path,
        help="per-tier goodput, attainment and p90 TTFT/TPOT vs rate (.svg or .png); with "
        "--compare, of the first results file",
    )
    o.add_argument("--compare", type=Path, nargs="+", help="plot these results into --plot")
    o.add_argument("--plan-log", type=Path, help="plot this saved timeline into --plot-plan")
    return p


def resolve_tiers(args: list[str]) -> list[TierSpec]:
    """Tiers from files and inline specs, in order; the defaults when none are given."""
    out: list[TierSpec] = []
    for a in args:
        if Path(a).suffix in (".json", ".toml"):
            if not Path(a).exists():
                raise ValueError(f"no such tiers file: {a}")
            out.extend(load_tiers_file(a))
        else:
            out.append(parse_tier_arg(a))
    names = [t.name for t in out]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate tier names in {names}")
    return out or list(DEFAULT_TIERS)


def discover_model(url: str, api_key: str | None) -> str | None:
    """The first model id the server lists, or None if it does not answer."""
    base = url.rstrip("/").removesuffix("/completions").removesuffix("/v1")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        data = httpx.get(base + "/v1/models", headers=headers, timeout=5.0).json()["data"]
        return str(data[0]["id"]) if data else None
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        return None


def _workload(
    args: argparse.Namespace, tiers: list[TierSpec], closed: list[closed_loop.ClosedRun] | None
) -> Workload:
    bursty = BurstySpec(
        low_rate=args.bursty_low_rate,
        high_rate=args.bursty_high_rate,
        period_s=args.bursty_period,
        duration_s=args.bursty_duration,
        burst_fraction=args.bursty_burst_fraction,
        input_lens=args.bursty_input,
        output_lens=args.bursty_output,
        seed=args.seed,
    )
    if args.tier_source and args.trace:
        raise ValueError("give --trace or --tier-source, not both")
    spec = WorkloadSpec(
        trace=args.trace or "azure-conv",
        start_s=args.start,
        duration_s=args.duration,
        input_scale=args.input_scale,
        output_scale=args.output_scale,
        max_context=args.max_context,
        tier_mix=args.tier_mix,
        tier_by_length=args.tier_by_length,
        default_tier=args.default_tier,
        seed=args.seed,
        bursty=bursty,
        trace_dir=args.trace_dir,
        tier_sources=tuple(args.tier_source),
        mix_schedule=args.mix_schedule,
        random=None if closed is None else closed_loop.random_spec(args, closed),
    )
    return build_workload(spec, tiers)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `nitsum bench`; returns the process exit code (2: bad options or
    trace, 1: no request of any run succeeded, 0 otherwise)."""
    args = build_parser().parse_args(argv)
    if args.plot or args.plot_tiers or args.plot_plan or args.plan_log:
        # NOTE: before any run: a sweep must not end in an ImportError (pyplot.py).
        try:
            pyplot.require()
        except pyplot.PlottingUnavailable as e:
            print(f"nitsum bench: {e}", file=sys.stderr)
            return 2
    if args.compare or args.plan_log:
        if args.compare:
            if not (args.plot or args.plot_tiers):
                print("nitsum bench: --compare needs --plot or --plot-tiers", file=sys.stderr)
                return 2
            if args.plot:
                plot_goodput_vs_rate(list(args.compare), args.plot)
            if args.plot_tiers:
                plot_tiers(load_results(args.compare[0]), args.plot_tiers)
        if args.plan_log:
            plot_plan_timeline(load_plan_log(args.plan_log), args.plot_plan or Path("plan.png"))
        return 0
    try:
        tiers = resolve_tiers(args.tiers)
        closed = closed_loop.closed_runs(args)
        w = _workload(args, tiers, closed)
        if any(k <= 0 for k in args.rate_scale):
            raise ValueError("--rate-scale values must be > 0")
    except (TraceError, ValueError, OSError) as e:
        print(f"nitsum bench: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        for key, reqs, duration, _ in sweep(args, w, closed, None):
            n_in = sum(r.input_len for r in reqs)
            n_out = sum(r.output_len for r in reqs)
            span = duration or 0.0
            tiers_n = {t.name: sum(1 for r in reqs if r.tier == t.name) for t in tiers}
            print(
                f"{run_name(key)}: {len(reqs)} requests over {span:.1f} s, "
                f"{n_in} prompt + {n_out} output tokens, tiers {tiers_n}"
            )
            if (args.mix_schedule or args.tier_source) and span > 0:
                quarters = tier_shares(reqs, span, 4)
                print(
                    "  tier shares per quarter: "
                    + " | ".join(
                        ", ".join(f"{n} {v:.2f}" for n, v in sorted(q.items())) or "-"
                        for q in quarters
                    )
                )
        return 0
    if not args.url:
        print("nitsum bench: --url is required (or --dry-run)", file=sys.stderr)
        return 2
    if args.plot_plan and not args.plan_url:
        print("nitsum bench: --plot-plan needs --plan-url; no timeline", file=sys.stderr)
    model = args.model or discover_model(args.url, args.api_key)
    runs: list[dict[str, Any]] = []
    results = {
        "label": args.label or args.trace or "+".join(args.tier_source) or "azure-conv",
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "argv": sys.argv[1:] if argv is None else list(argv),
        "model": model,
        "tiers": [{k: (None if v == math.inf else v) for k, v in asdict(t).items()} for t in tiers],
        "runs": runs,
    }
    base = ReplayConfig(
        url=completions_url(args.url),
        model=model,
        api_key=args.api_key,
        token_id_range=args.token_ids,
        seed=args.seed,
        concurrency=args.concurrency,
        request_timeout_s=args.request_timeout,
        deadline_s=args.timeout,
        plan_url=args.plan_url,
    )
    for key, reqs, duration, cfg in sweep(args, w, closed, base):
        assert cfg is not None
        runs.append(run_one(args, reqs, duration, tiers, cfg, key))
        if args.out:  # after every run, so an interrupted sweep keeps what it measured
            args.out.write_text(json.dumps(results, indent=1))
    if args.plot:
        plot_goodput_vs_rate([results], args.plot)
    if args.plot_tiers:
        plot_tiers(results, args.plot_tiers)
    return 0 if any(r["summary"]["n_ok"] for r in runs) else 1
