"""Multi-turn conversations with and without prefix reuse, side by side in one run.

The embedded SmolLM2-135M-Instruct on CPU, one engine. Each conversation's first turn has a
`--history`-token prompt and a 16-token answer; its second turn sends the whole first turn
back plus a 32-token message (what a chat client does). Reported: the second turn's TTFT and
the prompt tokens computed for it, with the prefix cache on and off (kv/prefix_cache.py).

Then the turns interleaved (every first turn, then every second turn) on a device KV pool
that holds about two histories (`--small-kv-mb`): the first conversations' pages are evicted
before their second turn; with the host tier (`--host-mb`) they move there and come back.

    python scripts/bench_prefix.py [--history 1200] [--conversations 4]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from nitsum.engine.engine_config import EngineConfig
from nitsum.engine.load import resolve_model_dir
from nitsum.engine.request_spec import RequestSpec
from nitsum.pool.local import open_local_engine
from nitsum.sampling import SamplingParams

ANSWER = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
NEW_MESSAGE = 32


def turn(engine, rid: str, prompt: list[int]) -> tuple[list[int], float, int]:
    """(tokens, TTFT s, prompt tokens computed) of one request served alone."""
    hits = engine.all_counters()["prefix_cache_hits"]
    engine.add_request(rid, prompt, RequestSpec(ANSWER))
    t0 = time.perf_counter()
    ttft, out = 0.0, []
    while engine.has_unfinished():
        for o in engine.step():
            if o.new_token_ids and not out:
                ttft = time.perf_counter() - t0
            out += o.new_token_ids
    return out, ttft, len(prompt) - (engine.all_counters()["prefix_cache_hits"] - hits)


def run(
    model_dir, caching: bool, history: int, n: int, ecfg: EngineConfig | None = None
) -> tuple[list[float], list[int], list]:
    """Each conversation's two turns in a row; with `ecfg`, every first turn, then every
    second turn."""
    interleaved = ecfg is not None
    ecfg = ecfg or EngineConfig()
    ecfg.prefix_caching = caching
    engine = open_local_engine(model_dir, ecfg)
    vocab = engine.cfg.vocab_size
    g = torch.Generator().manual_seed(0)

    def ids(k: int) -> list[int]:
        return torch.randint(100, vocab - 100, (k,), generator=g).tolist()

    firsts = [ids(history) for _ in range(n)]
    news = [ids(NEW_MESSAGE) for _ in range(n)]
    ttfts, computed, outs = [], [], []
    answers: dict[int, list[int]] = {}
    if interleaved:
        order = [(c, t) for t in (1, 2) for c in range(n)]
    else:
        order = [(c, t) for c in range(n) for t in (1, 2)]
    for c, t in order:
        if t == 1:
            answers[c], _, _ = turn(engine, f"c{c}-1", firsts[c])
            continue
        out, ttft, done = turn(engine, f"c{c}-2", firsts[c] + answers[c] + news[c])
        ttfts.append(ttft)
        computed.append(done)
        outs.append(out)
    return ttfts, computed, outs


def line(name: str, cold: tuple, warm: tuple) -> None:
    med = statistics.median
    print(
        f"{name}: turn-2 TTFT median {med(cold[0]) * 1e3:.0f} ms -> {med(warm[0]) * 1e3:.0f} ms "
        f"({med(cold[0]) / med(warm[0]):.1f}x better); prompt tokens computed "
        f"{sum(cold[1])} -> {sum(warm[1])} ({1 - sum(warm[1]) / sum(cold[1]):.0%} saved)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--history", type=int, default=1200)
    ap.add_argument("--conversations", type=int, default=4)
    ap.add_argument("--small-kv-mb", type=int, default=128, help="interleaved: device KV")
    ap.add_argument("--host-mb", type=int, default=512, help="interleaved: host tier")
    args = ap.parse_args()
    model_dir = resolve_model_dir(None)
    n, h = args.conversations, args.history
    cold = run(model_dir, False, h, n)
    warm = run(model_dir, True, h, n)
    assert warm[2] == cold[2], "reuse changed the answers"
    print(
        f"{n} conversations, {h}-token first turn, turn 2 = turn 1 + 16-token answer + "
        f"{NEW_MESSAGE} new tokens (same answers every way)"
    )
    line("turn after turn", cold, warm)

    def small(host_mb: int) -> EngineConfig:
        return EngineConfig(
            kv_cache_bytes=args.small_kv_mb << 20, host_kv_cache_bytes=host_mb << 20
        )

    device_only = run(model_dir, True, h, n, small(0))
    with_host = run(model_dir, True, h, n, small(args.host_mb))
    assert device_only[2] == with_host[2] == cold[2], "reuse changed the answers"
    line(f"interleaved, {args.small_kv_mb} MiB device KV, cache on device only", cold, device_only)
    line(f"interleaved, the same + {args.host_mb} MiB host tier", cold, with_host)


if __name__ == "__main__":
    main()
