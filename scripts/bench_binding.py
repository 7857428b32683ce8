"""Per-request TP binding (Flying Serving) on CPU device processes, side by side in one run.

A random GQA Llama (4 KV heads: TP 1/2; `--hidden` × `--layers`, big enough that a step is
compute, not messaging) on 2 device processes of one thread each, the plan two DP replicas
(0,) and (1,).

1. Bind + release latency without KV (a hard binding of an idle pool), p50/p99.
2. A mixed workload: short DP requests keep both replicas busy; every `--every` s a priority
   request (a latency tier's) arrives. Its TTFT and TPOT, and the total throughput, with the
   priority requests bound at TP 2 (hard: the replicas pause) vs served DP on the
   less-loaded replica at a better `priority` (the same requests, the same arrival times).
3. The longest prompt served: one replica's KV vs a bound TP-2 group's (served to the end).

    python scripts/bench_binding.py [--binds 100] [--seconds 20] [--every 1.0]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from nitsum.engine.engine_config import EngineConfig  # noqa: E402
from nitsum.engine.request_spec import RequestSpec
from nitsum.errors import InvalidRequestError  # noqa: E402
from nitsum.pool.device_pool import DevicePool  # noqa: E402
from nitsum.pool.device_proc import ModelSource  # noqa: E402
from nitsum.pool.pool_engine import PoolEngine  # noqa: E402
from nitsum.sampling import SamplingParams  # noqa: E402
from tiny import random_llama, random_prompt  # noqa: E402

P = 4
ECFG = EngineConfig(page_tokens=P, token_budget=128, tp_levels=(1, 2), prefix_caching=False)


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def bind_latency(pool: DevicePool, cfg, pages: int, n: int) -> None:
    pe = PoolEngine(pool, cfg, ECFG, pages, [(0,), (1,)])
    binds, releases = [], []
    for i in range(n):
        t0 = time.perf_counter()
        pe.add_request(
            f"b{i}", random_prompt(cfg, 8, i), RequestSpec(greedy(1), bind_tp=2, ttft_ms=1e3)
        )
        binds.append(time.perf_counter() - t0)
        while pe.has_unfinished():
            pe.step()  # the release runs at the end of the step that finished it
        assert not pe.binder.bindings
    # The release alone: the step releases a binding whose request finished; put it back and
    # time the release call by itself.
    for i in range(n):
        pe.add_request(
            f"r{i}", random_prompt(cfg, 8, i), RequestSpec(greedy(1), bind_tp=2, ttft_ms=1e3)
        )
        b = pe.binder.bindings[0]
        pe.step()
        assert not b.engine.has_unfinished()
        pe.binder.bindings.append(b)  # undo the step's release to time it alone
        t0 = time.perf_counter()
        pe.binder.release()
        releases.append(time.perf_counter() - t0)
    ms = [x * 1e3 for x in binds]
    rs = [x * 1e3 for x in releases]
    print(
        f"[bind] bind (add_request of a bound request, hard, no KV) p50 {pct(ms, 0.5):.2f} "
        f"p99 {pct(ms, 0.99):.2f} ms; release p50 {pct(rs, 0.5):.3f} p99 {pct(rs, 0.99):.3f} ms "
        f"(target < 5 ms each)"
    )


def mixed(pool: DevicePool, cfg, pages: int, args, bind: bool) -> dict[str, float]:
    pe = PoolEngine(pool, cfg, ECFG, pages, [(0,), (1,)])
    arrival: dict[str, float] = {}
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    count: dict[str, int] = {}
    tokens = 0
    t0 = time.monotonic()
    next_prio, n_short, n_prio = t0 + args.every / 2, 0, 0
    while time.monotonic() - t0 < args.seconds or pe.has_unfinished():
        now = time.monotonic()
        open_ = now - t0 < args.seconds
        for g in ((0,), (1,)):
            while open_ and len(pe.engines[g].request_ids()) < args.dp_batch:
                rid = f"d{n_short}"
                pe.add_request(
                    rid, random_prompt(cfg, 32, n_short), RequestSpec(greedy(16)), group=g
                )
                n_short += 1
        if open_ and now >= next_prio:
            rid = f"p{n_prio}"
            ids, params = random_prompt(cfg, 64, 10_000 + n_prio), greedy(32)
            if bind:
                pe.add_request(rid, ids, RequestSpec(params, bind_tp=2, ttft_ms=200))
            else:
                g = min(pe.engines, key=lambda g: len(pe.engines[g].request_ids()))
                pe.add_request(rid, ids, RequestSpec(params, ttft_ms=200, priority=-1), group=g)
            arrival[rid] = now
            n_prio += 1
            next_prio += args.every
        for o in pe.step():
            now = time.monotonic()
            tokens += len(o.new_token_ids)
            if o.request_id in arrival and o.new_token_ids:
                first.setdefault(o.request_id, now)
                last[o.request_id] = now
                count[o.request_id] = count.get(o.request_id, 0) + 1
    elapsed = time.monotonic() - t0
    ttft = [first[r] - arrival[r] for r in arrival]
    tpot = [(last[r] - first[r]) / (count[r] - 1) for r in arrival if count[r] > 1]
    return {
        "ttft50": statistics.median(ttft),
        "ttft99": pct(ttft, 0.99),
        "tpot50": statistics.median(tpot),
        "tok_s": tokens / elapsed,
        "prio": len(arrival),
    }


def longest(pool: DevicePool, cfg, pages: int) -> None:
    pe = PoolEngine(pool, cfg, ECFG, pages, [(0,), (1,)])
    dp_limit = pages * P  # tokens of one device at TP 1
    n = pe.max_servable_tokens() - 8
    ids = random_prompt(cfg, n, 1)
    try:
        pe.engines[(0,)].validate(ids, greedy(4))
        dp = "accepted"
    except InvalidRequestError:
        dp = "refused"
    t0 = time.perf_counter()
    pe.add_request("long", ids, RequestSpec(greedy(4)))
    out = []
    while pe.has_unfinished():
        out += [t for o in pe.step() for t in o.new_token_ids]
    print(
        f"[context] one replica holds {dp_limit} tokens ({n}-token prompt: {dp}); a bound TP-2 "
        f"group {pe.max_servable_tokens()}: the {n}-token prompt served, {len(out)} tokens in "
        f"{time.perf_counter() - t0:.2f} s ({pe.max_servable_tokens() / dp_limit:.0f}x the "
        f"DP limit)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--binds", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=20.0, help="mixed workload: arrivals")
    ap.add_argument("--every", type=float, default=1.0, help="seconds between priority ones")
    ap.add_argument("--dp-batch", type=int, default=8, help="short requests per replica")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    args = ap.parse_args()
    hf, cfg = random_llama(args.hidden, args.layers, vocab=128, max_positions=8448)
    source = ModelSource(hf_config=cfg.extra, state_dict=hf.state_dict())
    pages = 512
    with DevicePool(2, source, ECFG, pages, levels=(1, 2)) as pool:
        bind_latency(pool, cfg, pages, args.binds)
        dp = mixed(pool, cfg, pages, args, bind=False)
        bound = mixed(pool, cfg, pages, args, bind=True)
        for name, r in (("DP, priority -1", dp), ("bound at TP 2", bound)):
            print(
                f"[mixed] {name:15s}: {r['prio']} priority requests, TTFT p50 "
                f"{r['ttft50'] * 1e3:.0f} p99 {r['ttft99'] * 1e3:.0f} ms, TPOT p50 "
                f"{r['tpot50'] * 1e3:.1f} ms; total {r['tok_s']:.0f} tokens/s"
            )
        print(
            f"[mixed] binding vs DP: priority TTFT p50 {dp['ttft50'] / bound['ttft50']:.2f}x "
            f"better (target >= 2x), TPOT {dp['tpot50'] / bound['tpot50']:.2f}x; throughput "
            f"loss {1 - bound['tok_s'] / dp['tok_s']:.0%} (target <= 10%)"
        )
        longest(pool, cfg, pages)


if __name__ == "__main__":
    main()
