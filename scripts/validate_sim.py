"""Validate the cluster simulator against a small real CPU run on the SAME request list.

1. Cut a slice of the Azure conversation trace, scale its lengths to fit SmolLM2-135M on CPU
   (input = round(in × input_scale) clamped to [1, max_input], output likewise), slow it with
   the rate scale, tag tiers (seeded 50/50 mix) and write it once as JSONL (for `nitsum bench`)
   and JSON (for `nitsum simulate`).
2. Start `nitsum serve --workers 2` on random loopback ports (no plan in the router config:
   every worker is its own TP-1 mixed group serving every tier, unbounded, least loaded),
   replay the slice with `nitsum bench`, tear the server down (always).
3. Run `nitsum simulate --policy static --tp 1 --devices 2` (the same layout: ⌊N/1⌋ TP-1
   mixed groups, every tier, no admission limit) with the CPU profile on the same requests.
4. Compare goodput, attainment and TTFT/TPOT percentiles; write OUT/validate.json,
   OUT/validate.md and OUT/validate-cdf.png.

Tiers: the paper's method on the CPU profile (see scripts/results.py `derive_tiers`), unless
`--tiers` is given. Goodput on both sides = met / (last arrival − first arrival).

    /work/main/.venv/bin/python scripts/validate_sim.py --profile PROFILE.json
    .venv/bin/python scripts/validate_sim.py --profile P --duration 4 --max-requests 3 --warmup 0
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
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from nitsum.bench.bench_cli import discover_model  # noqa: E402
from nitsum.bench.traces import load_trace_file  # noqa: E402
from nitsum.bench.transform import slice_window  # noqa: E402
from nitsum.ports import free_port  # noqa: E402
from results import derive_tiers  # noqa: E402

PY = sys.executable


def build_requests(args: argparse.Namespace) -> list[dict]:
    reqs = slice_window(load_trace_file("azure-conv", args.trace_dir), args.start, args.duration)
    rng = random.Random(args.seed)
    out = []
    for r in reqs:
        out.append(
            {
                "arrival_s": round(r.arrival_s / args.rate_scale, 6),
                "input_len": min(args.max_input, max(1, round(r.input_len * args.input_scale))),
                "output_len": min(args.max_output, max(1, round(r.output_len * args.output_scale))),
                "tier": "strict" if rng.random() < 0.5 else "relaxed",
            }
        )
    if args.max_requests:
        out = out[: args.max_requests]
    return out


def wait_ready(url: str, workers: int, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"nitsum serve exited with {proc.returncode} during startup")
        try:
            r = httpx.get(url + "/health", timeout=2.0)
            if r.status_code == 200 and r.json().get("workers", 0) >= workers:
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"server not ready after {timeout_s:.0f} s")


def warm_up(url: str, n: int) -> None:
    """`n` short concurrent requests (not measured): first forwards on a fresh worker pay
    one-time allocation costs that the profile's warm-up also leaves out."""
    if n <= 0:
        return

    model = discover_model(url, None)

    def one(i: int) -> None:
        body = {"model": model, "prompt": [1000 + i] * 64, "max_tokens": 8, "ignore_eos": True}
        httpx.post(url + "/v1/completions", json=body, timeout=120.0).raise_for_status()

    from concurrent.futures import ThreadPoolExecutor

    t0 = time.monotonic()
    with ThreadPoolExecutor(n) as ex:
        list(ex.map(one, range(n)))
    print(f"warm-up: {n} requests in {time.monotonic() - t0:.1f} s", flush=True)


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM the launcher (it forwards to its workers and router), then SIGKILL the
    process group we created for it if anything is left."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=20)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # our own session: launcher + its children
    proc.wait(timeout=5)


def real_run(args: argparse.Namespace, out: Path, tiers_file: Path, jsonl: Path) -> dict:
    port, zmq_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    cfg = out / "router-config.json"
    tiers = json.loads(tiers_file.read_text())
    cfg.write_text(json.dumps({"tiers": tiers}, indent=1) + "\n")
    log = (out / "serve.log").open("w")
    serve_cmd = [
        PY, "-m", "nitsum.cli", "serve", "--workers", str(args.workers),
        "--port", str(port), "--worker-addr", f"tcp://127.0.0.1:{zmq_port}",
        "--config", str(cfg), "--startup-timeout", str(args.startup_timeout),
        "--no-control",  # the static TP-1 layout the simulation below replays
    ]  # fmt: skip
    print("$", " ".join(serve_cmd), flush=True)
    proc = subprocess.Popen(serve_cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_ready(url, args.workers, proc, args.startup_timeout)
        warm_up(url, args.warmup)
        last = max(json.loads(line)["timestamp"] for line in jsonl.read_text().splitlines())
        bench_cmd = [
            PY, "-m", "nitsum.cli", "bench", "--url", url, "--trace", str(jsonl),
            "--tiers", str(tiers_file), "--out", str(out / "bench.json"), "--no-progress",
            "--request-timeout", str(args.request_timeout),
            "--timeout", str(last + args.request_timeout + 10), "--seed", str(args.seed),
        ]  # fmt: skip
        print("$", " ".join(bench_cmd), flush=True)
        t0 = time.monotonic()
        subprocess.run(bench_cmd, check=False, timeout=last + args.request_timeout + 60)
        print(f"bench took {time.monotonic() - t0:.1f} s", flush=True)
    finally:
        stop(proc)
        log.close()
    return json.loads((out / "bench.json").read_text())


def pct(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    k = p / 100 * (len(xs) - 1)
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def gap(sim: float | None, real: float | None) -> float | None:
    if sim is None or real is None or real == 0:
        return None
    return (sim - real) / real


def compare(reqs: list[dict], tiers: list[dict], bench: dict, sim: dict) -> dict:
    by = {t["name"]: t for t in tiers}
    duration = max(r["arrival_s"] for r in reqs) - min(r["arrival_s"] for r in reqs)
    duration = max(duration, 1.0)  # the simulator's floor
    real_recs = bench["runs"][0]["records"]
    real = {"ttft": [], "tpot": [], "met": 0, "ok": 0}
    for rec in real_recs:
        if rec.get("error") is None and rec.get("ttft_s") is not None:
            real["ok"] += 1
            ttft, tpot = rec["ttft_s"] * 1e3, rec["tpot_s"] * 1e3
            real["ttft"].append(ttft)
            real["tpot"].append(tpot)
            t = by[rec["tier"]]
            real["met"] += ttft <= t["ttft_ms"] and tpot <= t["tpot_ms"]
    simr = {"ttft": [], "tpot": [], "met": 0, "ok": 0}
    for rec in sim["records"]:
        if not rec.get("dropped") and rec.get("ttft_ms") is not None:
            simr["ok"] += 1
            simr["ttft"].append(rec["ttft_ms"])
            simr["tpot"].append(rec["tpot_ms"])
            simr["met"] += bool(rec["met"])
    n = len(reqs)
    rows = {}
    for name, d in (("real", real), ("sim", simr)):
        rows[name] = {
            "completed": d["ok"],
            "met": d["met"],
            "goodput_rps": d["met"] / duration,
            "attainment": d["met"] / n,
            **{f"ttft_p{p}_ms": pct(d["ttft"], p) for p in (50, 90, 99)},
            **{f"tpot_p{p}_ms": pct(d["tpot"], p) for p in (50, 90, 99)},
            "ttft_mean_ms": statistics.fmean(d["ttft"]) if d["ttft"] else None,
        }
    rows["gap"] = {
        k: gap(rows["sim"][k], rows["real"][k])
        for k in ("goodput_rps", "ttft_p50_ms", "ttft_p90_ms", "tpot_p50_ms", "tpot_p90_ms")
    }
    rows["sim_reported"] = {"goodput_rps": sim["goodput_rps"], "duration_s": sim["duration_s"]}
    rows["real_reported"] = {
        "goodput_rps": bench["runs"][0]["summary"]["goodput"],
        "duration_s": bench["runs"][0]["summary"]["duration_s"],
        "wall_s": bench["runs"][0]["wall_s"],
    }
    rows["duration_s"] = duration
    rows["_series"] = {"real": real, "sim": simr}
    return rows


def slowdown_sweep(profile: dict, tiers: list[dict], reqs: list[dict], workers: int) -> list:
    """Re-simulate with every profile latency × f: which uniform slowdown of the measured
    profile reproduces the real run (a CPU shared with other work runs every forward slower)."""
    from nitsum import _core

    out = []
    for f in (1.0, 1.5, 2.0, 2.5, 3.0):
        p = json.loads(json.dumps(profile))
        for table in (p["prefill"], p["decode"]):
            for points in table.values():
                for x in points:
                    x["ms"] *= f
        cfg = {
            "profile": p,
            "tiers": tiers,
            "devices": workers,
            "policy": {"kind": "static_tp", "tp": 1},
            "requests": reqs,
            "records": True,
        }
        r = json.loads(_core.simulate(json.dumps(cfg)))
        recs = [x for x in r["records"] if x.get("ttft_ms") is not None]
        out.append(
            {
                "factor": f,
                "goodput_rps": r["goodput_rps"],
                "met": r["met"],
                "ttft_p50_ms": pct([x["ttft_ms"] for x in recs], 50),
                "tpot_p50_ms": pct([x["tpot_ms"] for x in recs], 50),
            }
        )
    return out


def alone_requests(reqs: list[dict], bench: dict, sim: dict) -> list[dict]:
    """Requests whose real [send, done] overlapped no other request: batch-1 service, the
    case the profile measures directly."""
    recs = bench["runs"][0]["records"]
    spans = [(r["send_s"], r["done_s"]) for r in recs if r.get("done_s") is not None]
    by_id = {r["id"]: r for r in sim["records"]}
    out = []
    for i, r in enumerate(recs):
        if r.get("done_s") is None:
            continue
        n = sum(1 for a, d in spans if a < r["done_s"] and d > r["send_s"]) - 1
        if n == 0:
            s = by_id[i]
            out.append(
                {
                    "id": i,
                    "input_len": r["input_len"],
                    "output_len": r["output_len"],
                    "real_ttft_ms": r["ttft_s"] * 1e3,
                    "sim_ttft_ms": s["ttft_ms"],
                    "real_tpot_ms": r["tpot_s"] * 1e3,
                    "sim_tpot_ms": s["tpot_ms"],
                }
            )
    return out


def plot_cdf(cmp: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(8, 3))
    for ax, key, label in ((axes[0], "ttft", "TTFT (ms)"), (axes[1], "tpot", "TPOT (ms)")):
        for name, color in (("real", "tab:blue"), ("sim", "tab:red")):
            xs = sorted(cmp["_series"][name][key])
            if xs:
                ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], color=color, label=name)
        ax.set_xlabel(label, fontsize=8)
        ax.set_ylabel("CDF", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle("2 CPU workers, SmolLM2-135M: measured vs simulated (static TP-1)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)


def fmt(v: float | None, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def report_md(cmp: dict, meta: dict) -> str:
    lines = [
        "| | completed | met | goodput (req/s) | attainment | TTFT p50 / p90 (ms) "
        "| TPOT p50 / p90 (ms) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in ("real", "sim"):
        r = cmp[name]
        lines.append(
            f"| {name} | {r['completed']}/{meta['requests']} | {r['met']} | "
            f"{fmt(r['goodput_rps'], '.3f')} | {fmt(r['attainment'], '.2f')} | "
            f"{fmt(r['ttft_p50_ms'])} / {fmt(r['ttft_p90_ms'])} | "
            f"{fmt(r['tpot_p50_ms'])} / {fmt(r['tpot_p90_ms'])} |"
        )
    g = cmp["gap"]
    lines.append(
        "| gap (sim − real) / real | | | "
        f"{fmt(g['goodput_rps'] and 100 * g['goodput_rps'], '+.0f')}% | | "
        f"{fmt(g['ttft_p50_ms'] and 100 * g['ttft_p50_ms'], '+.0f')}% / "
        f"{fmt(g['ttft_p90_ms'] and 100 * g['ttft_p90_ms'], '+.0f')}% | "
        f"{fmt(g['tpot_p50_ms'] and 100 * g['tpot_p50_ms'], '+.0f')}% / "
        f"{fmt(g['tpot_p90_ms'] and 100 * g['tpot_p90_ms'], '+.0f')}% |"
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", required=True, help="measured CPU profile JSON")
    ap.add_argument("--tiers", help="tiers JSON (default: derived from the profile)")
    ap.add_argument("--ttft-factor", type=float, default=3.0)
    ap.add_argument("--tpot-factor", type=float, default=1.5)
    ap.add_argument("--trace-dir", type=Path, default=ROOT.parent / "shared" / "traces")
    ap.add_argument("--start", type=float, default=600.0, help="trace window start, s")
    ap.add_argument("--duration", type=float, default=18.0, help="trace window, trace s")
    ap.add_argument("--rate-scale", type=float, default=0.2, help="< 1 slows the trace")
    ap.add_argument("--input-scale", type=float, default=0.125)
    ap.add_argument("--output-scale", type=float, default=0.1)
    ap.add_argument("--max-input", type=int, default=256)
    ap.add_argument("--max-output", type=int, default=32)
    ap.add_argument("--max-requests", type=int)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=4, help="unmeasured requests first")
    ap.add_argument("--startup-timeout", type=float, default=300.0)
    ap.add_argument("--request-timeout", type=float, default=60.0)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "validate")
    ap.add_argument(
        "--reuse-bench", action="store_true", help="simulate OUT/bench.json again, no server"
    )
    ap.add_argument("--dry-run", action="store_true", help="write the requests, run nothing")
    args = ap.parse_args(argv)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    profile = json.loads(Path(args.profile).read_text())

    if args.reuse_bench:
        reqs = json.loads((out / "requests.json").read_text())
    else:
        reqs = build_requests(args)
    if not reqs:
        print("no requests in the window", file=sys.stderr)
        return 2
    (out / "requests.json").write_text(json.dumps(reqs) + "\n")
    jsonl = out / "requests.jsonl"
    jsonl.write_text(
        "".join(
            json.dumps(
                {
                    "timestamp": r["arrival_s"],
                    "input_length": r["input_len"],
                    "output_length": r["output_len"],
                    "tier": r["tier"],
                }
            )
            + "\n"
            for r in reqs
        )
    )
    mean_in = statistics.fmean(r["input_len"] for r in reqs)
    mean_out = statistics.fmean(r["output_len"] for r in reqs)
    tiers, base = derive_tiers(profile, mean_in, mean_out, args.ttft_factor, args.tpot_factor)
    tiers_file = out / "tiers.json"
    if args.tiers:
        tiers = json.loads(Path(args.tiers).read_text())
    if args.reuse_bench:
        tiers = json.loads(tiers_file.read_text())  # the tiers that run was measured with
    else:
        tiers_file.write_text(json.dumps(tiers, indent=1) + "\n")
    span = reqs[-1]["arrival_s"] - reqs[0]["arrival_s"]
    meta = {
        "requests": len(reqs),
        "span_s": span,
        "rate_rps": len(reqs) / max(span, 1.0),
        "mean_input": mean_in,
        "mean_output": mean_out,
        "profile": str(args.profile),
        "profile_device": profile.get("device"),
        "profile_date": profile.get("date"),
        "tiers": tiers,
        "slo_bases": base,
        "argv": sys.argv[1:] if argv is None else argv,
    }
    print(json.dumps({k: v for k, v in meta.items() if k != "argv"}, indent=1), flush=True)
    if args.dry_run:
        return 0

    if args.reuse_bench:  # re-simulate an earlier real run (same requests and tiers)
        bench = json.loads((out / "bench.json").read_text())
    else:
        bench = real_run(args, out, tiers_file, jsonl)
    sim_cmd = [
        PY, "-m", "nitsum.cli", "simulate", "--profile", str(args.profile),
        "--trace", str(out / "requests.json"), "--tiers", str(tiers_file),
        "--devices", str(args.workers), "--policy", "static", "--tp", "1",
        "--records", "--out", str(out / "sim.json"),
    ]  # fmt: skip
    print("$", " ".join(sim_cmd), flush=True)
    subprocess.run(sim_cmd, check=True, timeout=300)
    sim = json.loads((out / "sim.json").read_text())

    cmp = compare(reqs, tiers, bench, sim)
    plot_cdf(cmp, out / "validate-cdf.png")
    series = cmp.pop("_series")
    res = {
        "meta": meta,
        "comparison": cmp,
        "alone": alone_requests(reqs, bench, sim),
        "slowdown_sweep": slowdown_sweep(profile, tiers, reqs, args.workers),
    }
    (out / "validate.json").write_text(json.dumps(res, indent=1) + "\n")
    md = report_md(cmp, meta)
    md += "\nRequests served alone (no other request in flight), real vs simulated:\n\n"
    md += "| id | input | output | TTFT real / sim (ms) | TPOT real / sim (ms) |\n"
    md += "|---|---|---|---|---|\n"
    for a in res["alone"]:
        md += (
            f"| {a['id']} | {a['input_len']} | {a['output_len']} | "
            f"{a['real_ttft_ms']:.0f} / {a['sim_ttft_ms']:.0f} | "
            f"{a['real_tpot_ms']:.0f} / {a['sim_tpot_ms']:.0f} |\n"
        )
    md += "\nSimulated with every profile latency × f:\n\n"
    md += "| f | goodput (req/s) | met | TTFT p50 (ms) | TPOT p50 (ms) |\n|---|---|---|---|---|\n"
    for x in res["slowdown_sweep"]:
        md += (
            f"| {x['factor']:g} | {x['goodput_rps']:.3f} | {x['met']} | "
            f"{x['ttft_p50_ms']:.0f} | {x['tpot_p50_ms']:.0f} |\n"
        )
    (out / "validate.md").write_text(md)
    print(md)
    del series
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
