"""A real run of a shifting tier mix: the control loop vs the same router at one TP level.

Issue 10, deliverable 5. With `nitsum serve --tp-switching` (one host worker over `--devices`
CPU device processes, real router, real engine), replay one request list against:

- `control`: the control loop with every TP level the profile and the model allow;
- `tpK`: the same router and control loop restricted to TP level K (`planner.tp_levels: [K]`
  in the router config; roles, tiers and the P/D split are still planned), for every K of
  `--static-levels` (default: all profiled levels). The best of them, chosen with hindsight,
  is "the best single TP level";
- with `--static-plan`, also `static`: no control loop at all (every device its own TP-1
  mixed group serving every tier), which prices what planning costs or gains.

The workload is a step change of the tier mix: a slice of the Azure conversation trace,
slowed by `--rate-scale` and with lengths scaled down so 2 cores can carry it (as in
scripts/validate_sim.py); requests arriving in the first half are strict with probability
`--first-strict`, the others relaxed; in the second half `--second-strict`. The tiers come from
the profile by the paper's method (scripts/results.py `derive_tiers`).

Prints a side-by-side table (goodput, control / best static, attainment overall, per tier and
per half, every request accounted for) and writes OUT/real_shift.json (+ per configuration:
OUT/NAME/bench.json, the plan timeline, the server log, /admin/plan at the end).

    /work/main/.venv/bin/python scripts/real_shift_run.py --out /tmp/shift
    /work/main/.venv/bin/python scripts/real_shift_run.py --dry-run   # the workload only

Every server runs on random loopback ports in its own session and is torn down with SIGTERM,
then SIGKILL of the session, whatever happens; every wait is bounded.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from nitsum.bench.bench_cli import discover_model  # noqa: E402
from nitsum.bench.traces import load_trace_file  # noqa: E402
from nitsum.bench.transform import slice_window  # noqa: E402
from nitsum.ports import free_port  # noqa: E402
from results import derive_tiers  # noqa: E402

PY = sys.executable
DEFAULT_PROFILE = ROOT / "profiles" / "cpu-2core-SmolLM2-135M-Instruct.json"


def loadavg() -> list[float]:
    """The 1, 5 and 15 minute load averages."""
    return [round(x, 2) for x in os.getloadavg()]


def build_requests(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The trace slice, slowed and shortened, with the tier mix stepping at its midpoint."""
    reqs = slice_window(load_trace_file("azure-conv", args.trace_dir), args.start, args.duration)
    if not reqs:
        return []
    rng = random.Random(args.seed)
    t0 = reqs[0].arrival_s
    mid = args.duration / 2
    out = []
    for r in reqs:
        first = r.arrival_s - t0 < mid
        p_strict = args.first_strict if first else args.second_strict
        out.append(
            {
                "arrival_s": round((r.arrival_s - t0) / args.rate_scale, 6),
                "input_len": min(args.max_input, max(1, round(r.input_len * args.input_scale))),
                "output_len": min(args.max_output, max(1, round(r.output_len * args.output_scale))),
                "tier": "strict" if rng.random() < p_strict else "relaxed",
                "half": 1 if first else 2,
            }
        )
    return out


def write_jsonl(reqs: list[dict[str, Any]], path: Path) -> None:
    """The request list in `nitsum bench`'s JSONL trace format."""
    lines = [
        json.dumps(
            {
                "timestamp": r["arrival_s"],
                "input_length": r["input_len"],
                "output_length": r["output_len"],
                "tier": r["tier"],
            }
        )
        for r in reqs
    ]
    path.write_text("\n".join(lines) + "\n")


def wait_ready(url: str, devices: int, proc: subprocess.Popen, timeout_s: float) -> None:
    """Until /health reports every device registered; RuntimeError if serve exits or times out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"nitsum serve exited with {proc.returncode} during startup")
        with contextlib.suppress(httpx.HTTPError, ValueError):
            r = httpx.get(url + "/health", timeout=2.0)
            if r.status_code == 200 and r.json().get("workers", 0) >= devices:
                return
        time.sleep(0.5)
    raise RuntimeError(f"server not ready after {timeout_s:.0f} s")


def warm_up(url: str, n: int) -> None:
    """`n` short relaxed requests, not measured: first forwards pay one-time costs."""
    if n <= 0:
        return

    model = discover_model(url, None)

    def one(i: int) -> None:
        body = {"model": model, "prompt": [1000 + i] * 64, "max_tokens": 8, "ignore_eos": True}
        headers = {"x-nitsum-tier": "relaxed"}
        httpx.post(url + "/v1/completions", json=body, headers=headers, timeout=120.0)

    with ThreadPoolExecutor(n) as ex:
        list(ex.map(one, range(n)))


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM the launcher (it stops its workers and router), then SIGKILL its session."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=20)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


@dataclass(frozen=True)
class Config:
    """One side of the comparison: a name, the TP levels the planner may use (None: every
    level), and whether the control loop runs at all."""

    name: str
    levels: list[int] | None
    control: bool = True


def router_config(tiers: list[dict], config: Config, window_ms: int) -> dict:
    """The router config of one configuration (tiers, window, planner TP levels)."""
    cfg: dict[str, Any] = {"tiers": tiers, "control_window_ms": window_ms}
    if config.levels is not None:
        cfg["planner"] = {"tp_levels": config.levels}
    return cfg


def group_kind(g: dict) -> str:
    """`role:tpK:tiers` of a planned group."""
    return f"{g['role']}:tp{g['tp']}:{'+'.join(g['tiers']) or 'all'}"


def layout(groups: list[dict]) -> list[tuple]:
    """Members, role and tiers of each group: what a round changes beyond capacities."""
    return sorted((tuple(g["members"]), g["role"], tuple(g["tiers"])) for g in groups)


def metric_sum(text: str, name: str) -> float:
    """Sum of every series of `name` in Prometheus text (`name` may carry its labels)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")) or (
            name.endswith("}") and line.startswith(name)
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


def run_config(
    config: Config, args: argparse.Namespace, tiers: list[dict], jsonl: Path
) -> dict[str, Any]:
    """Serve, warm up, replay `jsonl` with `nitsum bench`, collect, tear down."""
    name, levels = config.name, config.levels
    out = args.out / name
    out.mkdir(parents=True, exist_ok=True)
    cfg = out / "router-config.json"
    cfg.write_text(json.dumps(router_config(tiers, config, args.window_ms), indent=1) + "\n")
    control = ["--profile", str(args.profile)] if config.control else ["--no-control"]
    port, zmq_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    serve_cmd = [
        PY, "-m", "nitsum.cli", "serve", "--model", args.model,
        "--workers", str(args.devices), "--tp-switching", *control, "--config", str(cfg),
        "--port", str(port), "--worker-addr", f"tcp://127.0.0.1:{zmq_port}",
        "--kv-cache-mb", str(args.kv_cache_mb), "--startup-timeout", str(args.startup_timeout),
    ]  # fmt: skip
    loop = f"tp_levels {levels or 'all'}" if config.control else "no control loop"
    print(f"== {name}: {loop}; load {loadavg()}", flush=True)
    print("$", " ".join(serve_cmd), flush=True)
    info: dict[str, Any] = {
        "name": name,
        "tp_levels": levels,
        "control": config.control,
        "load_before": loadavg(),
    }
    t0 = time.monotonic()
    with (out / "serve.log").open("w") as log:
        proc = subprocess.Popen(
            serve_cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        wait_ready(url, args.devices, proc, args.startup_timeout)
        info["startup_s"] = round(time.monotonic() - t0, 1)
        warm_up(url, args.warmup)
        last = max(json.loads(line)["timestamp"] for line in jsonl.read_text().splitlines())
        bench_cmd = [
            PY, "-m", "nitsum.cli", "bench", "--url", url, "--trace", str(jsonl),
            "--tiers", str(args.out / "tiers.json"), "--out", str(out / "bench.json"),
            "--no-progress", "--request-timeout", str(args.request_timeout),
            "--timeout", str(last + args.request_timeout + 10), "--seed", str(args.seed),
            "--plan-url", url + "/admin/plan", "--plot-plan", str(out / "plan.png"),
        ]  # fmt: skip
        print("$", " ".join(bench_cmd), flush=True)
        t1 = time.monotonic()
        subprocess.run(bench_cmd, check=False, timeout=last + args.request_timeout + 60)
        info["bench_s"] = round(time.monotonic() - t1, 1)
        plan = httpx.get(url + "/admin/plan", timeout=10).json()
        (out / "admin-plan.json").write_text(json.dumps(plan, indent=1) + "\n")
        metrics = httpx.get(url + "/metrics", timeout=10).text
        (out / "metrics.txt").write_text(metrics)
        info["router"] = {
            k: metric_sum(metrics, f"nitsum_{k}")
            for k in (
                "requests_finished_total",
                "requests_error_total",
                "requests_rejected_total",
                "requests_inflight",
            )
        }
        info["router"]["rounds_applied"] = metric_sum(
            metrics, 'nitsum_plan_changes_total{result="applied"}'
        )
        info["plan_history"] = [
            {
                "result": h["result"],
                "epoch": h["epoch"],
                "round_ms": h.get("round_ms"),
                "groups": [group_kind(g) for g in h["groups"]],
                "regrouped": layout(h["groups"]) != layout(h.get("previous") or []),
            }
            for h in plan.get("history", [])
        ]
    finally:
        stop(proc)
        info["load_after"] = loadavg()
        info["wall_s"] = round(time.monotonic() - t0, 1)
    info["bench"] = json.loads((out / "bench.json").read_text())
    return info


def pct(xs: list[float], p: float) -> float | None:
    """Linear-interpolated percentile; None for no values."""
    if not xs:
        return None
    xs = sorted(xs)
    k = p / 100 * (len(xs) - 1)
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summarize(info: dict[str, Any], reqs: list[dict], tiers: list[dict]) -> dict[str, Any]:
    """Goodput, attainment overall / per tier / per half, and the accounting of one config."""
    by_tier = {t["name"]: t for t in tiers}
    run = info["bench"]["runs"][0]
    recs = sorted(run["records"], key=lambda r: r["index"])  # index = line of the JSONL
    assert [r["index"] for r in recs] == list(range(len(reqs))), "a request without a record"

    def met(rec: dict) -> bool:
        t = by_tier[rec["tier"]]
        return (
            rec.get("error") is None
            and rec.get("ttft_s") is not None
            and rec["ttft_s"] * 1e3 <= t["ttft_ms"]
            and rec["tpot_s"] * 1e3 <= t["tpot_ms"]
        )

    def attainment(sel: list[int]) -> float | None:
        return sum(met(recs[i]) for i in sel) / len(sel) if sel else None

    idx = range(len(recs))
    ok = [i for i in idx if recs[i].get("error") is None and recs[i].get("ttft_s") is not None]
    errors = [i for i in idx if i not in set(ok)]
    s = run["summary"]
    used = sorted({g for h in info.get("plan_history", []) for g in h["groups"]})
    return {
        "name": info["name"],
        "tp_levels": info["tp_levels"],
        "control": info["control"],
        "goodput_rps": s["goodput"],
        "duration_s": s["duration_s"],
        "attainment": attainment(list(idx)),
        "tiers": {t: attainment([i for i in idx if recs[i]["tier"] == t]) for t in by_tier},
        "halves": {h: attainment([i for i in idx if reqs[i]["half"] == h]) for h in (1, 2)},
        "sent": len(recs),
        "completed": len(ok),
        "errors": len(errors),
        "error_kinds": s["errors"],
        "ttft_p50_ms": pct([recs[i]["ttft_s"] * 1e3 for i in ok], 50),
        "ttft_p90_ms": pct([recs[i]["ttft_s"] * 1e3 for i in ok], 90),
        "tpot_p50_ms": pct([recs[i]["tpot_s"] * 1e3 for i in ok], 50),
        "tpot_p90_ms": pct([recs[i]["tpot_s"] * 1e3 for i in ok], 90),
        "rounds_applied": int((info.get("router") or {}).get("rounds_applied", 0)),
        # of the rounds /admin/plan keeps (the last 64): how many changed more than capacities
        "rounds_regrouped": sum(
            h["result"] == "applied" and h["regrouped"] for h in info.get("plan_history", [])
        ),
        "rounds_ms": sum(h["round_ms"] or 0 for h in info.get("plan_history", [])),
        "group_kinds_planned": used,
        "router": info.get("router"),
        "load_before": info["load_before"],
        "load_after": info["load_after"],
        "wall_s": info["wall_s"],
    }


def fmt(v: float | None, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def levels_column(row: dict[str, Any]) -> str:
    """The TP levels column: the planner's levels, or the fixed layout without a loop."""
    if not row["control"]:
        return "1 (no loop)"
    return "all" if row["tp_levels"] is None else ",".join(map(str, row["tp_levels"]))


def table(rows: list[dict[str, Any]]) -> str:
    """The side-by-side markdown table; the ratio is goodput / the best static goodput."""
    static = [r for r in rows if r["tp_levels"] is not None]  # the single-TP-level rows
    best = max(static, key=lambda r: r["goodput_rps"], default=None)
    lines = [
        "| config | TP levels | goodput (req/s) | / best static | attainment | strict | relaxed "
        "| 1st half | 2nd half | completed + errors = sent | rounds (regrouped) "
        "| TTFT p50/p90 (ms) "
        "| TPOT p50/p90 (ms) | load before → after |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = r["goodput_rps"] / best["goodput_rps"] if best and best["goodput_rps"] else None
        lines.append(
            f"| {r['name']}{' (best static)' if r is best else ''} "
            f"| {levels_column(r)} | {r['goodput_rps']:.3f} | {fmt(ratio)} "
            f"| {fmt(r['attainment'])} | {fmt(r['tiers'].get('strict'))} "
            f"| {fmt(r['tiers'].get('relaxed'))} | {fmt(r['halves'][1])} "
            f"| {fmt(r['halves'][2])} | {r['completed']} + {r['errors']} = {r['sent']} "
            f"| {r['rounds_applied']} ({r['rounds_regrouped']}) | {fmt(r['ttft_p50_ms'], '.0f')}/"
            f"{fmt(r['ttft_p90_ms'], '.0f')} | {fmt(r['tpot_p50_ms'], '.0f')}/"
            f"{fmt(r['tpot_p90_ms'], '.0f')} | {r['load_before'][0]} → {r['load_after'][0]} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", type=Path, default=DEFAULT_PROFILE, help="measured CPU profile")
    ap.add_argument("--model", default="default", help="served model (the profile's)")
    ap.add_argument("--devices", type=int, default=3, help="CPU devices of the host worker")
    ap.add_argument(
        "--static-levels",
        type=int,
        nargs="*",
        default=None,
        help="single TP levels to compare against (default: every profiled level <= devices)",
    )
    ap.add_argument(
        "--static-plan",
        action="store_true",
        help="also run without a control loop (every device a TP-1 mixed group)",
    )
    ap.add_argument("--trace-dir", type=Path, default=ROOT.parent / "shared" / "traces")
    ap.add_argument("--start", type=float, default=600.0, help="trace window start, s")
    ap.add_argument("--duration", type=float, default=16.0, help="trace window, trace s")
    ap.add_argument("--rate-scale", type=float, default=0.2, help="< 1 slows the trace")
    ap.add_argument("--input-scale", type=float, default=0.0625)
    ap.add_argument("--output-scale", type=float, default=0.1)
    ap.add_argument("--max-input", type=int, default=256)
    ap.add_argument("--max-output", type=int, default=32)
    ap.add_argument("--first-strict", type=float, default=0.8, help="strict share, 1st half")
    ap.add_argument("--second-strict", type=float, default=0.2, help="strict share, 2nd half")
    ap.add_argument("--ttft-factor", type=float, default=3.0)
    ap.add_argument("--tpot-factor", type=float, default=1.5)
    ap.add_argument("--window-ms", type=int, default=1000, help="control window")
    ap.add_argument("--kv-cache-mb", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=3, help="unmeasured requests first")
    ap.add_argument("--startup-timeout", type=float, default=240.0)
    ap.add_argument("--request-timeout", type=float, default=60.0)
    ap.add_argument("--out", type=Path, default=Path("real-shift"))
    ap.add_argument("--dry-run", action="store_true", help="write the workload, serve nothing")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    profile = json.loads(args.profile.read_text())
    levels = [t for t in profile["tp_levels"] if t <= args.devices]
    static = args.static_levels if args.static_levels is not None else levels
    if any(k not in levels for k in static):
        print(f"--static-levels {static}: not among the usable levels {levels}", file=sys.stderr)
        return 2

    reqs = build_requests(args)
    if not reqs:
        print("no requests in the window", file=sys.stderr)
        return 2
    jsonl = args.out / "requests.jsonl"
    write_jsonl(reqs, jsonl)
    mean_in = statistics.fmean(r["input_len"] for r in reqs)
    mean_out = statistics.fmean(r["output_len"] for r in reqs)
    tiers, bases = derive_tiers(profile, mean_in, mean_out, args.ttft_factor, args.tpot_factor)
    tiers = [t for t in tiers if not t.get("background")]
    (args.out / "tiers.json").write_text(json.dumps(tiers, indent=1) + "\n")
    span = reqs[-1]["arrival_s"]
    meta = {
        "model": args.model,
        "devices": args.devices,
        "profile": str(args.profile),
        "profile_date": profile.get("date"),
        "levels": levels,
        "requests": len(reqs),
        "span_s": span,
        "rate_rps": len(reqs) / max(span, 1.0),
        "mean_input": mean_in,
        "mean_output": mean_out,
        "strict_share": {
            h: sum(r["tier"] == "strict" for r in reqs if r["half"] == h)
            / max(1, sum(r["half"] == h for r in reqs))
            for h in (1, 2)
        },
        "tiers": tiers,
        "slo_bases": bases,
        "cpu_count": os.cpu_count(),
        "argv": sys.argv[1:] if argv is None else argv,
    }
    print(json.dumps({k: v for k, v in meta.items() if k != "argv"}, indent=1), flush=True)
    if args.dry_run:
        return 0

    t0 = time.monotonic()
    configs = [Config("control", None)] + [Config(f"tp{k}", [k]) for k in static]
    if args.static_plan:
        configs.append(Config("static", None, control=False))
    rows, infos = [], []
    for config in configs:
        info = run_config(config, args, tiers, jsonl)
        infos.append({k: v for k, v in info.items() if k != "bench"})
        rows.append(summarize(info, reqs, tiers))
        print(table(rows[-1:]), flush=True)
    md = table(rows)
    result = {
        "meta": meta,
        "rows": rows,
        "runs": infos,
        "total_wall_s": round(time.monotonic() - t0, 1),
    }
    (args.out / "real_shift.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "real_shift.md").write_text(md)
    print(md)
    print(f"total {result['total_wall_s']:.0f} s; results in {args.out}/real_shift.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
