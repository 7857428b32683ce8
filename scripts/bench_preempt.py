"""Priority preemption by KV swap vs by recompute, side by side in one run (FastSwitch).

1. Copy speed: the host tier's swap of page runs (pages allocated together move as one copy)
   and of scattered pages (one copy each), against a plain memcpy of the same bytes.
2. A priority workload on the embedded SmolLM2-135M-Instruct (CPU, one engine, batch 8):
   background conversations with long contexts keep the engine full; strict requests arrive
   every `--gap` seconds and preempt them. Reported for the strict tier: P50/P95/P99 TTFT and
   P99/P99.9 time between tokens; and total tokens/s; with preemption by recompute (no host
   tier) and by swap (host tier on); recompute also without the prefix cache (vLLM's
   recompute preemption: everything is prefilled again); swap with every swap-in synchronous
   (the step waits for the copy) against the adaptive swap manager (engine/swap.py).
   `--workload markov`: FastSwitch's Markov priority trace instead (multi-turn
   conversations whose turns' `priority` keeps switching; see `markov_workload`).

    python scripts/bench_preempt.py [--strict 30] [--gap 0.6] [--workload markov]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from nitsum.config import ModelConfig
from nitsum.engine.engine_config import EngineConfig
from nitsum.engine.load import resolve_model_dir
from nitsum.engine.request_spec import RequestSpec
from nitsum.kv.cache import KVCache
from nitsum.kv.host_tier import HostKVTier
from nitsum.pool.local import ONLY_GROUP, open_local_engine
from nitsum.sampling import SamplingParams


def copy_speed(cfg: ModelConfig, pages: int = 512) -> None:
    pool = KVCache(cfg, 2 * pages, 16)
    pool.storage.normal_()
    host = HostKVTier(pool, pages)
    nbytes = pages * KVCache.page_bytes_of(cfg, 16, torch.float32)

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


def open_engine(model_dir, host_mb: int, caching: bool, args: argparse.Namespace, swap: str):
    """One engine of batch `--batch` and `--kv-mb` of device KV, `host_mb` of host tier,
    swap-ins `swap` ("auto", "sync" or "async")."""
    ecfg = EngineConfig(
        kv_cache_bytes=args.kv_mb << 20,
        max_batch=args.batch,
        token_budget=512,
        host_kv_cache_bytes=host_mb << 20,
        prefix_caching=caching,
        swap_mode=swap,
    )
    return open_local_engine(model_dir, ecfg)


def report(engine, ttft: list[float], gaps: list[float], tok_s: float) -> dict[str, float]:
    """TTFT percentiles, P99 and P99.9 time between tokens, throughput, preemption counts."""
    c = engine.all_counters()
    return {
        "p50": pct(ttft, 0.5),
        "p95": pct(ttft, 0.95),
        "p99": pct(ttft, 0.99),
        "tbt99": pct(gaps, 0.99),
        "tbt999": pct(gaps, 0.999),
        "waits": c["swap_waits"],
        "tok_s": tok_s,
        "preempt": c["num_preemptions"],
        "swapped": c["num_preemptions_swap"],
    }


def workload(
    model_dir, host_mb: int, caching: bool, args: argparse.Namespace, swap: str = "auto"
) -> dict[str, float]:
    engine = open_engine(model_dir, host_mb, caching, args, swap)
    vocab = engine.cfg.vocab_size
    g = torch.Generator().manual_seed(0)
    bg_params = SamplingParams(max_tokens=args.bg_tokens, temperature=0, ignore_eos=True)
    strict_params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)

    def ids(n: int) -> list[int]:
        return torch.randint(100, vocab - 100, (n,), generator=g).tolist()

    for i in range(args.background):
        engine.add_request(
            f"bg{i}", ids(args.bg_prompt), RequestSpec(bg_params, slo_class="background", tier="bg")
        )
    arrival: dict[str, float] = {}
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    gaps: list[float] = []
    tokens = 0
    # The strict requests start once the background conversations that fit are all decoding.
    running = engine.engines[ONLY_GROUP].scheduler.running
    while not running or any(s.remaining > 1 for s in running):
        tokens += sum(len(o.new_token_ids) for o in engine.step())
    t0 = time.monotonic()
    next_at = t0
    sent = 0
    while sent < args.strict or any(r.startswith("s") for r in engine.engines[ONLY_GROUP].seqs):
        now = time.monotonic()
        if sent < args.strict and now >= next_at:
            rid = f"s{sent}"
            engine.add_request(
                rid, ids(48), RequestSpec(strict_params, slo_class="feasible", tier="strict")
            )
            arrival[rid] = now
            sent += 1
            next_at += args.gap
        for o in engine.step():
            now = time.monotonic()
            tokens += len(o.new_token_ids)
            if o.request_id.startswith("s") and o.new_token_ids:
                if o.request_id in first:
                    gaps.append(now - last[o.request_id])
                first.setdefault(o.request_id, now)
                last[o.request_id] = now
    elapsed = time.monotonic() - t0
    ttft = [first[r] - arrival[r] for r in arrival]
    return report(engine, ttft, gaps, tokens / elapsed)


def markov_workload(
    model_dir, host_mb: int, caching: bool, args: argparse.Namespace, swap: str = "auto"
) -> dict[str, float]:
    """FastSwitch's Markov priority trace: `--conversations` multi-turn conversations run turn
    after turn; each turn's `priority` (0 high, 1 low, one class) follows a per-conversation
    two-state Markov chain (stay with probability 0.7), so priorities keep changing and the
    engine keeps preempting low turns for high ones. Reported for the high-priority turns after
    each conversation's first (those all arrive at once, at the start)."""
    import random

    engine = open_engine(model_dir, host_mb, caching, args, swap)
    vocab = engine.cfg.vocab_size
    g = torch.Generator().manual_seed(0)
    rng = random.Random(0)
    answer = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)

    def ids(n: int) -> list[int]:
        return torch.randint(100, vocab - 100, (n,), generator=g).tolist()

    history = {c: ids(600) for c in range(args.conversations)}
    priority = {c: rng.randint(0, 1) for c in range(args.conversations)}
    turn = dict.fromkeys(history, 0)
    arrival: dict[str, float] = {}
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    gaps: list[float] = []
    outs: dict[str, list[int]] = {}
    high: set[str] = set()
    tokens = 0

    def submit(c: int) -> None:
        rid = f"c{c}t{turn[c]}"
        engine.add_request(
            rid, history[c], RequestSpec(answer, slo_class="feasible", priority=priority[c])
        )
        arrival[rid] = time.monotonic()
        if priority[c] == 0 and turn[c] > 0:  # later turns: the cold start's queue aside
            high.add(rid)

    for c in history:
        submit(c)
    t0 = time.monotonic()
    while engine.has_unfinished():
        for o in engine.step():
            now = time.monotonic()
            tokens += len(o.new_token_ids)
            outs.setdefault(o.request_id, []).extend(o.new_token_ids)
            if o.new_token_ids:
                if o.request_id in first and o.request_id in high:
                    gaps.append(now - last[o.request_id])
                first.setdefault(o.request_id, now)
                last[o.request_id] = now
            if o.finished:
                c = int(o.request_id[1:].split("t")[0])
                turn[c] += 1
                if turn[c] < args.turns:  # the next turn: the answer and a new message
                    history[c] = history[c] + outs[o.request_id] + ids(64)
                    stay = rng.random() < 0.7
                    priority[c] = priority[c] if stay else 1 - priority[c]
                    submit(c)
    elapsed = time.monotonic() - t0
    ttft = [first[r] - arrival[r] for r in high]
    return report(engine, ttft, gaps, tokens / elapsed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--strict", type=int, default=30, help="strict requests (8 tokens each)")
    ap.add_argument("--gap", type=float, default=0.6, help="seconds between strict arrivals")
    ap.add_argument("--background", type=int, default=10, help="background conversations")
    ap.add_argument("--bg-prompt", type=int, default=800, help="their context (tokens)")
    ap.add_argument("--bg-tokens", type=int, default=400, help="their output (tokens)")
    ap.add_argument("--batch", type=int, default=6, help="the engine's max batch")
    ap.add_argument("--kv-mb", type=int, default=160, help="device KV pool (MiB)")
    ap.add_argument(
        "--workload", choices=("tiers", "markov"), default="tiers", help="see the docstring"
    )
    ap.add_argument("--conversations", type=int, default=12, help="markov: conversations")
    ap.add_argument("--turns", type=int, default=3, help="markov: turns per conversation")
    args = ap.parse_args()
    model_dir = resolve_model_dir(None)
    copy_speed(ModelConfig.from_hf(json.loads((model_dir / "config.json").read_text())))
    run = workload if args.workload == "tiers" else markov_workload
    who = "strict" if args.workload == "tiers" else "high-priority"
    modes = {
        "recompute, no prefix cache": run(model_dir, 0, False, args),
        "recompute": run(model_dir, 0, True, args),
        "swap, synchronous": run(model_dir, 1024, True, args, "sync"),
        "swap": run(model_dir, 1024, True, args),
    }
    for name, r in modes.items():
        print(
            f"{name:26s}: {who} TTFT p50 {r['p50'] * 1e3:.0f} p95 {r['p95'] * 1e3:.0f} "
            f"p99 {r['p99'] * 1e3:.0f} ms, TBT p99 {r['tbt99'] * 1e3:.0f} "
            f"p99.9 {r['tbt999'] * 1e3:.0f} ms; {r['tok_s']:.1f} tok/s; preemptions "
            f"{r['preempt']} ({r['swapped']} by swap, steps waiting for a copy {r['waits']})"
        )
    swp = modes["swap"]
    for name in ("recompute, no prefix cache", "recompute", "swap, synchronous"):
        rec = modes[name]
        print(
            f"swap vs {name}: {who} P99 TTFT {rec['p99'] / swp['p99']:.2f}x better, "
            f"P99 TBT {rec['tbt99'] / swp['tbt99']:.2f}x, P99.9 TBT "
            f"{rec['tbt999'] / swp['tbt999']:.2f}x, throughput {swp['tok_s'] / rec['tok_s']:.2f}x"
        )


if __name__ == "__main__":
    main()
