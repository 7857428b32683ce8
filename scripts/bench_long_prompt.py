"""Long prompts vs short ones on one worker: first-token waits with and without overtaking,
side by side in one run (issue 11: one long prompt must not block short ones).

The embedded SmolLM2-135M-Instruct on CPU, one engine, 512-token budget. An 8000-token prompt
starts prefilling; right after its first step, short prompts (32 tokens) arrive. Reported: how
long the shorts wait for their first token and the long prompt's own TTFT, under plain FCFS
within a class and with overtaking (engine/prompt_order.py), for a long prompt without a TTFT
target (background) and with a generous one (60 s: it has slack to spare).

    python scripts/bench_long_prompt.py [--long 8000] [--shorts 4]
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

SHORT_LEN = 32
OUT = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)


def run(model_dir, overtaking: bool, long_len: int, n_short: int, ttft_ms: float | None):
    """(mean short wait s, max short wait s, long TTFT s) for one configuration."""
    ecfg = EngineConfig(kv_cache_bytes=512 << 20, token_budget=512, overtaking=overtaking)
    engine = open_local_engine(model_dir, ecfg)
    g = torch.Generator().manual_seed(0)
    vocab = engine.cfg.vocab_size
    slo_class, tier = ("feasible", "relaxed") if ttft_ms else ("background", "background")
    t0 = time.monotonic()
    long = torch.randint(100, vocab - 100, (long_len,), generator=g).tolist()
    engine.add_request(
        "long", long, RequestSpec(OUT, slo_class=slo_class, tier=tier, ttft_ms=ttft_ms)
    )
    first: dict[str, float] = {}
    arrived: dict[str, float] = {}

    def step() -> None:
        for o in engine.step():
            if o.new_token_ids:
                first.setdefault(o.request_id, time.monotonic())

    step()
    for i in range(n_short):
        ids = torch.randint(100, vocab - 100, (SHORT_LEN,), generator=g).tolist()
        engine.add_request(
            f"s{i}", ids, RequestSpec(OUT, slo_class=slo_class, tier=tier, ttft_ms=ttft_ms)
        )
        arrived[f"s{i}"] = time.monotonic()
    while engine.has_unfinished():
        step()
    waits = [first[r] - arrived[r] for r in arrived]
    return statistics.mean(waits), max(waits), first["long"] - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--long", type=int, default=8000)
    ap.add_argument("--shorts", type=int, default=4)
    args = ap.parse_args()
    model_dir = resolve_model_dir(None)
    print(f"{args.long}-token prompt, then {args.shorts} x {SHORT_LEN}-token prompts, one engine")
    for label, ttft_ms in (("no TTFT target", None), ("TTFT 60 s", 60_000.0)):
        fcfs = run(model_dir, False, args.long, args.shorts, ttft_ms)
        over = run(model_dir, True, args.long, args.shorts, ttft_ms)
        print(
            f"{label}: short first-token wait mean {fcfs[0]:.2f} s -> {over[0]:.2f} s "
            f"({fcfs[0] / over[0]:.1f}x shorter), max {fcfs[1]:.2f} -> {over[1]:.2f} s; "
            f"long TTFT {fcfs[2]:.2f} -> {over[2]:.2f} s ({over[2] / fcfs[2]:.2f}x)"
        )


if __name__ == "__main__":
    main()
