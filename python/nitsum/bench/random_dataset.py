"""The requests of `vllm bench serve`'s random dataset (`--trace random`; closed_loop.py runs
them): every prompt the same length, every output asked for in full, all at t = 0."""

from __future__ import annotations

from dataclasses import dataclass

from nitsum.bench.traces import TraceRequest

DEFAULT_PROMPTS = 100


@dataclass(frozen=True, slots=True)
class RandomSpec:
    """Requests of the random dataset: `num_prompts` prompts of `input_len` ids, each
    asking for exactly `output_len` tokens (`ignore_eos`, as every replayed request)."""

    input_len: int = 1024
    output_len: int = 128
    num_prompts: int = DEFAULT_PROMPTS


def random_requests(spec: RandomSpec) -> list[TraceRequest]:
    """`num_prompts` arrivals at t = 0 (a closed loop has no arrival times)."""
    if min(spec.input_len, spec.output_len, spec.num_prompts) < 1:
        raise ValueError(f"random lengths and prompt count must be >= 1, got {spec}")
    return [TraceRequest(0.0, spec.input_len, spec.output_len) for _ in range(spec.num_prompts)]
