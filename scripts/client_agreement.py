"""Do `vllm bench serve --goodput` and `nitsum bench` judge requests as the router does?

One `nitsum serve --workers 2` with the tiers of `--config`; then, in one session:
1. `vllm bench serve`, one process per tier (the `x-nitsum-tier` header), N requests each at
   RATE req/s, `--goodput` with that tier's targets;
2. `nitsum bench` at the same total load (the tiers mixed half and half).
Around each client's run the router's own `nitsum_requests_slo_met_total` and
`nitsum_requests_finished_total` are read from `/metrics`: the server-side verdict on the
very requests that client sent. Printed per tier: client good / sent beside the router's
met / finished over that client's window. A client agrees when the two are equal.

Two clients can still differ from each other, because their requests see different
latencies (different runs on a noisy machine). The router's counts show which of the two it
was. vLLM is not a dependency of this project: pass the `vllm` executable of its own venv.

    .venv/bin/python scripts/client_agreement.py --vllm /path/to/venv/bin/vllm \
        --config router.json --out /tmp/agree
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx

from nitsum.ports import free_port

PY = sys.executable
COUNTER = re.compile(r'nitsum_requests_(finished|slo_met)_total\{tier="(\w+)"\} (\S+)')


def counters(base: str) -> dict[tuple[str, str], float]:
    """(finished | slo_met, tier) -> value, from the router's /metrics."""
    text = httpx.get(f"{base}/metrics", timeout=10).text
    return {(m[1], m[2]): float(m[3]) for m in COUNTER.finditer(text)}


def delta(a: dict, b: dict, kind: str, tier: str) -> int:
    return round(b.get((kind, tier), 0) - a.get((kind, tier), 0))


def vllm_good(result: dict, ttft_ms: float, tpot_ms: float) -> int:
    """Requests within both targets by vLLM's rule: TTFT, and (latency − TTFT) / (output − 1)."""
    rows = zip(result["ttfts"], result["latencies"], result["output_lens"], strict=True)
    return sum(
        t * 1e3 <= ttft_ms and (lat - t) / max(n - 1, 1) * 1e3 <= tpot_ms for t, lat, n in rows
    )


def run_vllm(args: argparse.Namespace, base: str, model: str, tiers: list[dict]) -> list[dict]:
    procs = []
    for tier in tiers:
        name = tier["name"]
        cmd = [args.vllm, "bench", "serve", "--backend", "openai", "--base-url", base]
        cmd += ["--endpoint", "/v1/completions", "--model", model, "--tokenizer", args.model_dir]
        cmd += ["--dataset-name", "random", "--random-input-len", str(args.input_len)]
        cmd += ["--random-output-len", str(args.output_len), "--ignore-eos", "--seed", "0"]
        cmd += ["--num-prompts", str(args.requests), "--request-rate", str(args.rate)]
        cmd += ["--header", f"x-nitsum-tier={name}", "--goodput"]
        cmd += [f"ttft:{tier['ttft_ms']}", f"tpot:{tier['tpot_ms']}", "--save-result"]
        cmd += ["--save-detailed", "--result-dir", str(args.out)]
        cmd += ["--result-filename", f"vllm-{name}.json"]
        log = open(args.out / f"vllm-{name}.log", "w")  # noqa: SIM115 - closed below
        procs.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), log))
    for proc, log in procs:
        code = proc.wait(timeout=600)
        log.close()
        assert code == 0, f"vllm bench serve exited {code}: see {log.name}"
    return [json.loads((args.out / f"vllm-{t['name']}.json").read_text()) for t in tiers]


def run_nitsum_bench(args: argparse.Namespace, base: str, tiers: list[dict]) -> dict:
    total = args.rate * len(tiers)
    duration = args.requests / args.rate
    mix = ",".join(f"{t['name']}={1 / len(tiers):.3f}" for t in tiers)
    cmd = [PY, "-m", "nitsum.cli", "bench", "--url", base, "--trace", "bursty"]
    cmd += ["--bursty-low-rate", str(total), "--bursty-high-rate", str(total)]
    cmd += ["--bursty-duration", str(duration)]
    cmd += ["--bursty-input", f"{args.input_len}:{args.input_len}"]
    cmd += ["--bursty-output", f"{args.output_len}:{args.output_len}"]
    cmd += ["--tiers", str(args.config), "--tier-mix", mix, "--seed", "0"]
    cmd += ["--out", str(args.out / "nitsum-bench.json")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"nitsum bench exited {done.returncode}:\n{done.stderr[-3000:]}"
    return json.loads((args.out / "nitsum-bench.json").read_text())


def bench_tier(report: dict, tier: str) -> tuple[int, int]:
    """(met, completed) of `tier` in a `nitsum bench` report's first run."""
    t = report["runs"][0]["summary"]["tiers"][tier]
    return t["n_good"], t["n_ok"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vllm", required=True, help="the `vllm` executable (its own venv)")
    p.add_argument("--config", type=Path, required=True, help="router config with the tiers")
    p.add_argument("--model-dir", help="the served model's directory (default: prepared)")
    p.add_argument("--requests", type=int, default=10, help="per tier")
    p.add_argument("--rate", type=float, default=0.5, help="req/s per tier")
    p.add_argument("--input-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--out", type=Path, default=Path("client-agreement"))
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.model_dir is None:
        from nitsum.weights.prepare import resolve_model

        args.model_dir = str(resolve_model(None))
    tiers = [t for t in json.loads(args.config.read_text())["tiers"] if not t.get("background")]
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    serve = [PY, "-m", "nitsum.cli", "serve", "--workers", "2", "--port", str(port)]
    serve += ["--worker-addr", f"tcp://127.0.0.1:{free_port()}", "--config", str(args.config)]
    log = open(args.out / "serve.log", "w")  # noqa: SIM115 - closed below
    server = subprocess.Popen(serve, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while "ready at" not in (args.out / "serve.log").read_text():
            assert server.poll() is None and time.monotonic() < deadline, "serve not ready"
            time.sleep(0.5)
        model = httpx.get(f"{base}/v1/models", timeout=10).json()["data"][0]["id"]
        c0 = counters(base)
        vllm = run_vllm(args, base, model, tiers)
        c1 = counters(base)
        bench = run_nitsum_bench(args, base, tiers)
        c2 = counters(base)
    finally:
        server.terminate()
        server.wait(timeout=60)
        log.close()
    print(
        "tier      | vllm good/sent | router over vllm's run | nitsum bench good/done"
        " | router over nitsum bench's run"
    )
    agree = True
    for tier, result in zip(tiers, vllm, strict=True):
        name = tier["name"]
        good = vllm_good(result, tier["ttft_ms"], tier["tpot_ms"])
        router_v = (delta(c0, c1, "slo_met", name), delta(c0, c1, "finished", name))
        met, done = bench_tier(bench, name)
        router_b = (delta(c1, c2, "slo_met", name), delta(c1, c2, "finished", name))
        agree &= (good, result["completed"]) == router_v and (met, done) == router_b
        print(
            f"{name:9} | {good:>4}/{result['completed']:<9} | {router_v[0]:>10}/{router_v[1]:<11}"
            f" | {met:>10}/{done:<11} | {router_b[0]:>10}/{router_b[1]}"
            f"   (vllm TTFT p50 {result['median_ttft_ms']:.0f} ms, TPOT p50"
            f" {result['median_tpot_ms']:.0f} ms)"
        )
    print(f"each client agrees with the router on its own requests: {agree}")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
