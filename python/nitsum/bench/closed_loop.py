"""Closed-loop runs shaped like `vllm bench serve --dataset-name random` (`--trace random`).

`vllm bench serve --dataset-name random --random-input-len I --random-output-len O
--ignore-eos --num-prompts N --max-concurrency C` (request rate inf) issues its N requests at
once, each a prompt of I random token ids with `max_tokens` O, and lets at most C be in
flight: a new one starts when one finishes. Here those are N arrivals at t = 0 replayed
with the replay's concurrency cap set to C (replay.py: a request beyond the cap waits
client-side and its TTFT starts when it is sent, as vLLM's does), one run per concurrency.
The prompts are token-id lists (`/v1/completions` takes them; docs/serving.md), drawn from
`--token-ids`, so their length is exact: nothing is re-tokenized. ITL pools the gaps between
streamed tokens of every request, TPOT is each request's mean gap, output tok/s the output
tokens over the run's wall time (report.py), as vLLM reports them.

    nitsum bench --url URL --trace random --random-input-len 1024 --random-output-len 128 \\
        --max-concurrency 1 16 64 --num-prompts 8 64 256 --token-ids 0:128000
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace

from nitsum.bench.random_dataset import DEFAULT_PROMPTS, RandomSpec
from nitsum.bench.replay import ReplayConfig
from nitsum.bench.traces import TraceRequest
from nitsum.bench.workload import Workload, run_requests

DEFAULT_CONCURRENCY = (1,)
# NOTE: a run's seed is the base seed plus this times its index: every run draws prompts
# of its own, so no run finds its prompts in the prefix cache an earlier run filled.
SEED_STRIDE = 1000


@dataclass(frozen=True, slots=True)
class ClosedRun:
    """One run of a closed-loop sweep: its concurrency and how many requests it sends."""

    concurrency: int
    num_prompts: int


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The `--trace random` options (names as `vllm bench serve`'s)."""
    g = p.add_argument_group("closed loop (--trace random, as vllm bench serve's random set)")
    g.add_argument("--random-input-len", type=int, default=1024, help="prompt tokens")
    g.add_argument("--random-output-len", type=int, default=128, help="output tokens")
    g.add_argument(
        "--max-concurrency", type=int, nargs="+", help="requests in flight; one run per value "
        f"(default {DEFAULT_CONCURRENCY[0]})",
    )  # fmt: skip
    g.add_argument(
        "--num-prompts", type=int, nargs="+", help="requests per run: one value, or one per "
        f"--max-concurrency value (default {DEFAULT_PROMPTS})",
    )  # fmt: skip


def closed_runs(args: argparse.Namespace) -> list[ClosedRun] | None:
    """The closed-loop sweep `args` asks for; None when the trace is not `random`. Raises
    ValueError for closed-loop options without it, or counts that do not pair up."""
    given = args.max_concurrency is not None or args.num_prompts is not None
    if args.trace != "random":
        if given:
            raise ValueError("--max-concurrency and --num-prompts need --trace random")
        return None
    if args.rate_scale != [1.0]:
        raise ValueError("--trace random is a closed loop: --rate-scale does not apply")
    if args.max_requests is not None:
        raise ValueError("--trace random: give --num-prompts, not --max-requests")
    levels = list(args.max_concurrency or DEFAULT_CONCURRENCY)
    counts = list(args.num_prompts or [DEFAULT_PROMPTS])
    if len(counts) == 1:
        counts *= len(levels)
    if len(counts) != len(levels):
        raise ValueError(
            f"--num-prompts: one value or one per --max-concurrency value ({len(levels)})"
        )
    if min(levels + counts) < 1:
        raise ValueError("--max-concurrency and --num-prompts must be >= 1")
    return [ClosedRun(c, n) for c, n in zip(levels, counts, strict=True)]


def random_spec(args: argparse.Namespace, runs: list[ClosedRun]) -> RandomSpec:
    """The workload every run of the sweep cuts its requests from (the largest count)."""
    most = max(r.num_prompts for r in runs)
    return RandomSpec(args.random_input_len, args.random_output_len, most)


def run_plan(
    w: Workload, run: ClosedRun, index: int, base: ReplayConfig
) -> tuple[list[TraceRequest], ReplayConfig]:
    """The requests of run `index` of the sweep and its replay config (its concurrency cap
    and its own prompts' seed)."""
    reqs, _ = run_requests(w, 1.0, run.num_prompts)
    return reqs, replace(base, concurrency=run.concurrency, seed=base.seed + SEED_STRIDE * index)
