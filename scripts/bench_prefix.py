"""Multi-turn conversations with and without prefix reuse, side by side in one run.

The embedded SmolLM2-135M-Instruct on CPU, one engine. Each conversation's first turn has a
`--history`-token prompt and a 16-token answer; its second turn sends the whole first turn
back plus a 32-token message (what a chat client does). Reported: the second turn's TTFT and
the prompt tokens computed for it, with the prefix cache on and off (kv/prefix_cache.py).

    python scripts/bench_prefix.py [--history 1200] [--conversations 4]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from nitsum.engine.build import EngineConfig
from nitsum.engine.load import resolve_model_dir
from nitsum.pool.local import open_local_engine
from nitsum.sampling import SamplingParams

ANSWER = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
NEW_MESSAGE = 32


def turn(engine, rid: str, prompt: list[int]) -> tuple[list[int], float, int]:
    """(tokens, TTFT s, prompt tokens computed) of one request served alone."""
    hits = engine.all_counters()["prefix_cache_hits"]
    engine.add_request(rid, prompt, ANSWER)
    t0 = time.perf_counter()
    ttft, out = 0.0, []
    while engine.has_unfinished():
        for o in engine.step():
            if o.new_token_ids and not out:
                ttft = time.perf_counter() - t0
            out += o.new_token_ids
    return out, ttft, len(prompt) - (engine.all_counters()["prefix_cache_hits"] - hits)


def run(model_dir, caching: bool, history: int, n: int) -> tuple[list[float], list[int], list]:
    engine = open_local_engine(model_dir, EngineConfig(prefix_caching=caching))
    vocab = engine.cfg.vocab_size
    g = torch.Generator().manual_seed(0)
    ttfts, computed, outs = [], [], []
    for c in range(n):
        first = torch.randint(100, vocab - 100, (history,), generator=g).tolist()
        answer, _, _ = turn(engine, f"c{c}-1", first)
        second = (
            first + answer + torch.randint(100, vocab - 100, (NEW_MESSAGE,), generator=g).tolist()
        )
        out, ttft, done = turn(engine, f"c{c}-2", second)
        ttfts.append(ttft)
        computed.append(done)
        outs.append(out)
    return ttfts, computed, outs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--history", type=int, default=1200)
    ap.add_argument("--conversations", type=int, default=4)
    args = ap.parse_args()
    model_dir = resolve_model_dir(None)
    cold = run(model_dir, False, args.history, args.conversations)
    warm = run(model_dir, True, args.history, args.conversations)
    assert warm[2] == cold[2], "reuse changed the answers"
    med = statistics.median
    print(
        f"{args.conversations} conversations, {args.history}-token first turn, "
        f"turn 2 = turn 1 + 16-token answer + {NEW_MESSAGE} new tokens (same answers both ways)"
    )
    print(
        f"turn-2 TTFT median {med(cold[0]) * 1e3:.0f} ms -> {med(warm[0]) * 1e3:.0f} ms "
        f"({med(cold[0]) / med(warm[0]):.1f}x better); prompt tokens computed "
        f"{sum(cold[1])} -> {sum(warm[1])} ({1 - sum(warm[1]) / sum(cold[1]):.0%} saved)"
    )


if __name__ == "__main__":
    main()
