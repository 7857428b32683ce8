"""SLO tiers by the paper's method (§4 "SLO setups"), derived from a profile, for results.py.

The profile lookups follow the semantics of scheduler-rs/src/profile/ (docs/planner.md).
`scripts/validate_sim.py` imports `derive_tiers` through `results`.
"""

from __future__ import annotations


def _interp(xs: list[float], ys: list[float], x: float) -> float:
    """Piecewise linear; holds the first value below the first point and extrapolates the
    last segment past the last point."""
    if x <= xs[0] or len(xs) == 1:
        return ys[0]
    for i in range(1, len(xs)):
        if x <= xs[i] or i == len(xs) - 1:
            x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    raise AssertionError


def prefill_ms(profile: dict, tp: int, tokens: float) -> float:
    pts = sorted(profile["prefill"][str(tp)], key=lambda p: p["tokens"])
    return _interp([p["tokens"] for p in pts], [p["ms"] for p in pts], tokens)


def prefill_fixed_ms(profile: dict, tp: int) -> float:
    """The prefill curve extrapolated to 0 tokens, clamped to [0, first point]."""
    pts = sorted(profile["prefill"][str(tp)], key=lambda p: p["tokens"])
    if len(pts) < 2:
        return pts[0]["ms"]
    (x0, y0), (x1, y1) = (pts[0]["tokens"], pts[0]["ms"]), (pts[1]["tokens"], pts[1]["ms"])
    return min(max(y0 - (y1 - y0) / (x1 - x0) * x0, 0.0), y0)


def decode_ms(profile: dict, tp: int, batch: float, context: float) -> float:
    """Linear in batch within each profiled context row, linear between rows."""
    rows: dict[int, list[dict]] = {}
    for p in profile["decode"][str(tp)]:
        rows.setdefault(p["context"], []).append(p)
    ctxs = sorted(rows)
    per_row = []
    for c in ctxs:
        pts = sorted(rows[c], key=lambda p: p["batch"])
        per_row.append(_interp([p["batch"] for p in pts], [p["ms"] for p in pts], batch))
    return _interp([float(c) for c in ctxs], per_row, context)


def max_batch(profile: dict, tp: int) -> int:
    return max(p["batch"] for p in profile["decode"][str(tp)])


def derive_tiers(
    profile: dict,
    mean_in: float,
    mean_out: float,
    ttft_factor: float,
    tpot_factor: float,
    big_batch: int = 128,
) -> tuple[list[dict], dict]:
    """SLO tiers by the paper's method (§4 "SLO setups"), from the profile instead of a run.

    At the smallest profiled TP level, with the trace's mean prompt L and output O (decode
    context c = L + O/2):
    - strict (batch 1): TTFT = prefill_ms(L); TPOT = decode_ms(batch 1, c).
    - relaxed (batch `big_batch`, 128 in the paper, capped at the profile's largest batch):
      TPOT = decode_ms(batch B, c); TTFT = the iteration that prefills one prompt while B
      requests decode: decode_ms(B, c) + prefill_ms(L) - prefill_fixed_ms (one weight read).
    Then TTFT × `ttft_factor`, TPOT × `tpot_factor`. Returns (tiers, the unscaled bases).
    """
    tp = min(profile["tp_levels"])
    ctx = mean_in + mean_out / 2
    b = min(big_batch, max_batch(profile, tp))
    base = {
        "tp": tp,
        "mean_input": round(mean_in, 1),
        "mean_output": round(mean_out, 1),
        "context": round(ctx, 1),
        "big_batch": b,
        "strict_ttft_ms": prefill_ms(profile, tp, mean_in),
        "strict_tpot_ms": decode_ms(profile, tp, 1, ctx),
        "relaxed_ttft_ms": decode_ms(profile, tp, b, ctx)
        + prefill_ms(profile, tp, mean_in)
        - prefill_fixed_ms(profile, tp),
        "relaxed_tpot_ms": decode_ms(profile, tp, b, ctx),
    }
    tiers = [
        {
            "name": name,
            "ttft_ms": round(base[f"{name}_ttft_ms"] * ttft_factor, 2),
            "tpot_ms": round(base[f"{name}_tpot_ms"] * tpot_factor, 2),
        }
        for name in ("strict", "relaxed")
    ]
    base = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in base.items()}
    return tiers, base


# The paper's Table 1 (Llama-8B, H100, TP 1), verbatim: the second tier set of the sweep.
TABLE1_TIERS = [
    {"name": "strict", "ttft_ms": 300.0, "tpot_ms": 10.0},
    {"name": "relaxed", "ttft_ms": 300.0, "tpot_ms": 20.0},
]
BACKGROUND_TIER = {"name": "background", "ttft_ms": 0.0, "tpot_ms": 0.0, "background": True}


def mean_lengths(reqs: list[dict]) -> tuple[float, float]:
    """Mean input and output length of `reqs` (dicts with input_len, output_len)."""
    n = len(reqs)
    return sum(r["input_len"] for r in reqs) / n, sum(r["output_len"] for r in reqs) / n
