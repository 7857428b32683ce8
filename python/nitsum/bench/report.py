"""Goodput, SLO attainment and latency percentiles: pure functions of request records.

Definitions (the Nitsum paper's, §4):
- A request is *good* when it completed without error and TTFT <= its tier's `ttft_ms` and
  TPOT <= its tier's `tpot_ms` (both inclusive). Errors, timeouts and unsent requests are not.
- **Goodput** = good requests / trace duration (requests/s), where the trace duration is the
  replayed arrival span (see `cli.trace_duration`), not the wall time of the run: a system
  that falls behind does not get a longer denominator.
- **Background tiers** have no SLO: they count toward completion (`n_ok`, completion rate,
  latency percentiles) but neither toward goodput nor toward SLO attainment.
- Attainment of a tier = good / all requests of that tier (errors included).
- Percentiles are over completed requests only, numpy's linear interpolation.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from nitsum.bench.record import RequestRecord
from nitsum.bench.tiers import TierSpec

PERCENTILES = (50, 90, 99)


def percentile(values: Sequence[float], p: float) -> float | None:
    """The p-th percentile with linear interpolation between order statistics (numpy's
    default): rank = p/100 · (n − 1). None for no values."""
    if not values:
        return None
    xs = sorted(values)
    rank = p / 100.0 * (len(xs) - 1)
    lo = math.floor(rank)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (rank - lo)


def distribution(values: Sequence[float], scale: float = 1.0) -> dict[str, float | None]:
    """`{"mean", "p50", "p90", "p99"}` of `values × scale` (None when empty)."""
    xs = [v * scale for v in values]
    out: dict[str, float | None] = {"mean": sum(xs) / len(xs) if xs else None}
    for p in PERCENTILES:
        out[f"p{p}"] = percentile(xs, p)
    return out


def meets_slo(rec: RequestRecord, tier: TierSpec) -> bool:
    """Completed, TTFT <= ttft_ms and TPOT <= tpot_ms. Background tiers never count as met."""
    if tier.background or not rec.ok:
        return False
    ttft, tpot = rec.ttft_s, rec.tpot_s
    assert ttft is not None and tpot is not None  # NOTE: rec.ok implies both are set
    return ttft * 1e3 <= tier.ttft_ms and tpot * 1e3 <= tier.tpot_ms


def inter_token_gaps(rec: RequestRecord) -> list[float]:
    """Seconds between consecutive token chunks of one request (vLLM's ITL samples)."""
    t = rec.chunk_times
    return [b - a for a, b in zip(t, t[1:], strict=False)]


def latency_summary(records: Iterable[RequestRecord]) -> dict[str, dict[str, float | None]]:
    """TTFT, TPOT and ITL (ms) and E2E (s) distributions of the completed records. ITL pools
    every gap between two token chunks of every request, as `vllm bench serve` does; TPOT is
    one value per request (its mean gap)."""
    ok = [r for r in records if r.ok]
    return {
        "ttft_ms": distribution([r.ttft_s for r in ok], 1e3),  # type: ignore[misc]
        "tpot_ms": distribution([r.tpot_s for r in ok], 1e3),  # type: ignore[misc]
        "itl_ms": distribution([g for r in ok for g in inter_token_gaps(r)], 1e3),
        "e2e_s": distribution([r.e2e_s for r in ok]),  # type: ignore[misc]
    }


def summarize(
    records: Sequence[RequestRecord], tiers: Sequence[TierSpec], duration_s: float
) -> dict[str, Any]:
    """The JSON summary of one run. Raises `ValueError` for a record whose tier is unknown."""
    if duration_s <= 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s}")
    by_name = {t.name: t for t in tiers}
    for r in records:
        if r.tier not in by_name:
            raise ValueError(f"request {r.index} has tier {r.tier!r}, not in {list(by_name)}")
    good = [r for r in records if meets_slo(r, by_name[r.tier])]  # type: ignore[index]
    slo_records = [r for r in records if not by_name[r.tier].background]  # type: ignore[index]
    ok = [r for r in records if r.ok]
    lags = [r.send_s - r.scheduled_s for r in records if r.send_s is not None]
    per_tier: dict[str, Any] = {}
    for t in tiers:
        mine = [r for r in records if r.tier == t.name]
        n_good = sum(1 for r in mine if meets_slo(r, t))
        per_tier[t.name] = {
            "background": t.background,
            "ttft_ms_slo": None if t.background else t.ttft_ms,
            "tpot_ms_slo": None if t.background else t.tpot_ms,
            "n": len(mine),
            "n_ok": sum(1 for r in mine if r.ok),
            "n_good": None if t.background else n_good,
            "attainment": None if t.background or not mine else n_good / len(mine),
            "goodput": None if t.background else n_good / duration_s,
            "latency": latency_summary(mine),
        }
    return {
        "n_requests": len(records),
        "n_ok": len(ok),
        "n_errors": len(records) - len(ok),
        "n_good": len(good),
        "duration_s": duration_s,
        "request_rate": len(records) / duration_s,
        "slo_request_rate": len(slo_records) / duration_s,  # the goodput ceiling
        "goodput": len(good) / duration_s,
        "slo_attainment": len(good) / len(slo_records) if slo_records else None,
        "completion_rate": len(ok) / len(records) if records else None,
        "output_tokens_per_s": sum(r.n_out for r in ok) / duration_s,
        "input_tokens_per_s": sum(r.input_len for r in ok) / duration_s,
        "send_lag_s": {"p99": percentile(lags, 99), "max": max(lags, default=None)},
        "errors": dict(Counter((r.error or "").split(":")[0] for r in records if not r.ok)),
        "latency": latency_summary(records),
        "tiers": per_tier,
    }


def format_summary(s: dict[str, Any]) -> str:
    """A few human-readable lines of a summary."""

    def ms(d: dict[str, float | None], key: str) -> str:
        return "-" if d[key] is None else f"{d[key]:.1f}"

    lat = s["latency"]
    lines = [
        f"requests {s['n_requests']} ok {s['n_ok']} errors {s['n_errors']} "
        f"over {s['duration_s']:.1f} s ({s['request_rate']:.2f} req/s)",
        f"goodput {s['goodput']:.3f} req/s, SLO attainment "
        + ("-" if s["slo_attainment"] is None else f"{s['slo_attainment']:.1%}"),
        f"TTFT ms p50/p90/p99 {ms(lat['ttft_ms'], 'p50')}/{ms(lat['ttft_ms'], 'p90')}/"
        f"{ms(lat['ttft_ms'], 'p99')}  TPOT ms p50/p90/p99 {ms(lat['tpot_ms'], 'p50')}/"
        f"{ms(lat['tpot_ms'], 'p90')}/{ms(lat['tpot_ms'], 'p99')}",
    ]
    for name, t in s["tiers"].items():
        att = (
            "background"
            if t["background"]
            else ("-" if t["attainment"] is None else f"attainment {t['attainment']:.1%}")
        )
        lines.append(f"  {name}: n {t['n']} ok {t['n_ok']} {att}")
    if s["errors"]:
        lines.append(f"  errors: {s['errors']}")
    return "\n".join(lines)
