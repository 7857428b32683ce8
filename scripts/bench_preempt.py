"""Priority preemption by KV swap vs by recompute, side by side in one run (FastSwitch).

1. Copy speed: the host tier's swap of page runs (pages allocated together move as one copy)
   and of scattered pages (one copy each), against a plain memcpy of the same bytes.
2. A priority workload on the embedded SmolLM2-135M-Instruct (CPU, one engine, batch 8):
   background conversations with long contexts keep the engine full; strict requests arrive
   every `--gap` seconds and preempt them. Reported for the strict tier: P50/P95/P99 TTFT and
   P99 time between tokens; and total tokens/s; with preemption by recompute (no host tier)
   and by swap (host tier on). The prefix cache is on in both.

    python scripts/bench_preempt.py [--strict 24] [--gap 0.4]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from nitsum.config import ModelConfig
from nitsum.engine.build import EngineConfig
from nitsum.engine.load import resolve_model_dir
from nitsum.kv.host_pool import HostKVPool
from nitsum.kv.pool import KVPool
from nitsum.pool.local import open_local_engine
from nitsum.sampling import SamplingParams


def copy_speed(cfg: ModelConfig, pages: int = 512) -> None:
    pool = KVPool(cfg, 2 * pages, 16)
    pool.storage.normal_()
    host = HostKVPool(pool, pages)
    nbytes = pages * KVPool.page_bytes_of(cfg, 16, torch.float32)

    def best(fn) -> float:
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return nbytes / min(times) / 1e9

    flat_src = torch.empty(nbytes // 4)
    flat_dst = torch.empty(nbytes // 4)
    flat_src.normal_()
    memcpy = best(lambda: flat_dst.copy_(flat_src))
    run = [(p, p) for p in range(pages)]
    scattered = [(2 * p, p) for p in range(pages)]  # no two consecutive: one copy per page
    runs = best(lambda: host.swap(run, []))
    singles = best(lambda: host.swap(scattered, []))
    print(
        f"copy {nbytes >> 20} MiB to host: memcpy {memcpy:.1f} GB/s; swap of page runs "
        f"{runs:.1f} GB/s ({runs / memcpy:.0%} of memcpy); one copy per page {singles:.1f} GB/s "
        f"({runs / singles:.1f}x slower than runs)"
    )


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def workload(model_dir, host_mb: int, n_strict: int, gap: float) -> dict[str, float]:
    ecfg = EngineConfig(
        kv_cache_bytes=48 << 20, max_batch=8, token_budget=512, host_kv_cache_bytes=host_mb << 20
    )
    engine = open_local_engine(model_dir, ecfg)
    vocab = engine.cfg.vocab_size
    g = torch.Generator().manual_seed(0)
    bg_params = SamplingParams(max_tokens=160, temperature=0, ignore_eos=True)
    strict_params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)

    def ids(n: int) -> list[int]:
        return torch.randint(100, vocab - 100, (n,), generator=g).tolist()

    n_bg = 0

    def add_background() -> None:
        nonlocal n_bg
        engine.add_request(f"bg{n_bg}", ids(900), bg_params, klass="background", tier="bg")
        n_bg += 1

    for _ in range(8):
        add_background()
    arrival: dict[str, float] = {}
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    gaps: list[float] = []
    tokens = 0
    t0 = time.monotonic()
    next_at = t0 + 2.0  # let the background fill the engine first
    sent = 0
    while sent < n_strict or any(r.startswith("s") for r in engine.engines[(0,)].seqs):
        now = time.monotonic()
        if sent < n_strict and now >= next_at:
            rid = f"s{sent}"
            engine.add_request(rid, ids(64), strict_params, klass="feasible", tier="strict")
            arrival[rid] = now
            sent += 1
            next_at += gap
        for o in engine.step():
            now = time.monotonic()
            tokens += len(o.new_token_ids)
            if o.request_id.startswith("s") and o.new_token_ids:
                if o.request_id in first:
                    gaps.append(now - last[o.request_id])
                first.setdefault(o.request_id, now)
                last[o.request_id] = now
            if o.finished and o.request_id.startswith("bg"):
                add_background()  # keep the engine full
    elapsed = time.monotonic() - t0
    ttft = [first[r] - arrival[r] for r in arrival]
    c = engine.all_counters()
    return {
        "p50": pct(ttft, 0.5),
        "p95": pct(ttft, 0.95),
        "p99": pct(ttft, 0.99),
        "tbt99": pct(gaps, 0.99),
        "tok_s": tokens / elapsed,
        "preempt": c["num_preemptions"],
        "swapped": c["num_preemptions_swap"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--strict", type=int, default=24, help="strict requests")
    ap.add_argument("--gap", type=float, default=0.4, help="seconds between strict arrivals")
    args = ap.parse_args()
    model_dir = resolve_model_dir(None)
    copy_speed(ModelConfig.from_hf(json.loads((model_dir / "config.json").read_text())))
    rec = workload(model_dir, 0, args.strict, args.gap)
    swp = workload(model_dir, 512, args.strict, args.gap)
    for name, r in (("recompute", rec), ("swap", swp)):
        print(
            f"{name:9s}: strict TTFT p50 {r['p50'] * 1e3:.0f} p95 {r['p95'] * 1e3:.0f} "
            f"p99 {r['p99'] * 1e3:.0f} ms, TBT p99 {r['tbt99'] * 1e3:.0f} ms; "
            f"{r['tok_s']:.0f} tok/s; preemptions {r['preempt']} ({r['swapped']} by swap)"
        )
    print(
        f"swap vs recompute: strict P99 TTFT {rec['p99'] / swp['p99']:.2f}x better, "
        f"P99 TBT {rec['tbt99'] / swp['tbt99']:.2f}x, throughput {swp['tok_s'] / rec['tok_s']:.2f}x"
    )


if __name__ == "__main__":
    main()
