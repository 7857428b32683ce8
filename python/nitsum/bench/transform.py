"""Trace transformations: time window, rate scaling, length scaling/clamping, request cap.

All are pure: they take a list of `TraceRequest` and return a new list, order preserved.
"""

from __future__ import annotations

from dataclasses import replace

from nitsum.bench.traces import TraceRequest


def slice_window(
    reqs: list[TraceRequest], start_s: float = 0.0, duration_s: float | None = None
) -> list[TraceRequest]:
    """Requests arriving in `[start_s, start_s + duration_s)`, rebased to the window start.

    NOTE: arrivals are shifted by `start_s`, not by the first arrival inside the window, so a
    quiet beginning of the window is kept and the window's rate is preserved.
    """
    if start_s < 0 or (duration_s is not None and duration_s <= 0):
        raise ValueError("need start_s >= 0 and duration_s > 0")
    end = float("inf") if duration_s is None else start_s + duration_s
    return [
        replace(r, arrival_s=r.arrival_s - start_s) for r in reqs if start_s <= r.arrival_s < end
    ]


def scale_rate(reqs: list[TraceRequest], rate_scale: float) -> list[TraceRequest]:
    """Multiply the arrival rate by `rate_scale` (arrivals are divided by it)."""
    if rate_scale <= 0:
        raise ValueError(f"rate_scale must be > 0, got {rate_scale}")
    return [replace(r, arrival_s=r.arrival_s / rate_scale) for r in reqs]


def scale_lengths(
    reqs: list[TraceRequest],
    input_scale: float = 1.0,
    output_scale: float = 1.0,
    max_context: int | None = None,
) -> list[TraceRequest]:
    """Scale token counts (rounded, at least 1), then clamp each request into `max_context`.

    Clamping keeps the output length when it can (decode work is what TPOT measures): the
    output is capped at `max_context - 1`, then the input at `max_context - output`, so
    `input + output <= max_context` and both stay >= 1.
    """
    if input_scale <= 0 or output_scale <= 0:
        raise ValueError("length scales must be > 0")
    if max_context is not None and max_context < 2:
        raise ValueError("max_context must be >= 2")
    out = []
    for r in reqs:
        n_in = max(1, round(r.input_len * input_scale))
        n_out = max(1, round(r.output_len * output_scale))
        if max_context is not None:
            n_out = min(n_out, max_context - 1)
            n_in = min(n_in, max_context - n_out)
        out.append(replace(r, input_len=n_in, output_len=n_out))
    return out


def limit(reqs: list[TraceRequest], max_requests: int | None) -> list[TraceRequest]:
    """The first `max_requests` requests (all when None)."""
    if max_requests is None:
        return list(reqs)
    if max_requests < 0:
        raise ValueError("max_requests must be >= 0")
    return list(reqs[:max_requests])
