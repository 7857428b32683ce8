"""SLO tiers for the benchmark: the tiers spec and the rules that give each request a tier.

A tier is `{name, ttft_ms, tpot_ms, background}` as in the router's tiers config
(`scheduler-rs/src/tiers.rs`); `weight` and API keys are the router's business and ignored
here. Background tiers carry no SLO for goodput (see `report.py`); their TTFT/TPOT may be
omitted (or 0, as in the router's config) and then default to infinity.
"""

from __future__ import annotations

import json
import math
import random
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

from nitsum.bench.traces import TraceRequest


@dataclass(frozen=True, slots=True)
class TierSpec:
    """One SLO tier: a request meets it when TTFT <= ttft_ms and TPOT <= tpot_ms."""

    name: str
    ttft_ms: float
    tpot_ms: float
    background: bool = False


def _tier_from_mapping(obj: object, where: str) -> TierSpec:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise ValueError(f"{where}: a tier needs a string 'name'")
    background = bool(obj.get("background", False))
    default = math.inf if background else None
    vals = {}
    for key in ("ttft_ms", "tpot_ms"):
        v = obj.get(key, default)
        if background and v is None:
            v = math.inf  # JSON has no infinity: the router writes null for "no SLO"
        if background and not isinstance(v, bool) and isinstance(v, int | float) and v <= 0:
            v = math.inf  # the router's tiers config writes 0 for a background tier: no SLO
        if isinstance(v, bool) or not isinstance(v, int | float) or v <= 0:
            raise ValueError(f"{where}: tier {obj['name']!r} needs {key} > 0, got {v!r}")
        vals[key] = float(v)
    return TierSpec(obj["name"], vals["ttft_ms"], vals["tpot_ms"], background)


def _router_default_tiers() -> tuple[TierSpec, ...]:
    """The router's default tiers (`scheduler-rs/src/config.rs`, `default_tiers`)."""
    import nitsum._core as _core  # NOTE: late: the native module is only needed here

    return tuple(
        _tier_from_mapping(
            {
                "name": t.name,
                "ttft_ms": t.ttft_ms,
                "tpot_ms": t.tpot_ms,
                "background": t.background,
            },
            "the router's default tiers",
        )
        for t in _core.default_tiers()
    )


# NOTE: one source with the router: a benchmark without `--tier` judges requests by the tiers
# a default router plans for. On other hardware pass tiers measured there (the paper's
# method: batch-1 latency for strict, batch-128 for relaxed; scripts/results_tiers.py).
DEFAULT_TIERS: tuple[TierSpec, ...] = _router_default_tiers()


def load_tiers_file(path: str | Path) -> list[TierSpec]:
    """Tiers from a JSON or TOML file: a list of tier tables, or a `tiers` key holding one
    (so the router's tiers config, which also lists API keys, can be passed as is)."""
    path = Path(path)
    text = path.read_text()
    obj = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    if isinstance(obj, dict):
        obj = obj.get("tiers")
    if not isinstance(obj, list) or not obj:
        raise ValueError(f"{path}: expected a non-empty list of tiers")
    return [_tier_from_mapping(t, str(path)) for t in obj]


def parse_tier_arg(text: str) -> TierSpec:
    """`strict:ttft=500,tpot=15` or `batch:background` (optionally with ttft/tpot too)."""
    name, _, rest = text.partition(":")
    obj: dict[str, object] = {"name": name.strip()}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, val = item.partition("=")
        if key == "background" and not eq:
            obj["background"] = True
        elif key in ("ttft", "tpot", "ttft_ms", "tpot_ms") and eq:
            try:
                obj[key.removesuffix("_ms") + "_ms"] = float(val)
            except ValueError:
                raise ValueError(f"tier {text!r}: {key} must be a number") from None
        else:
            raise ValueError(f"tier {text!r}: unknown item {item!r}")
    return _tier_from_mapping(obj, "--tiers")


def _parse_pairs(text: str, sep: str) -> list[tuple[str, str]]:
    pairs = []
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, _, val = item.partition(sep)
        pairs.append((name.strip(), val.strip()))
    return pairs


def assign_by_mix(reqs: list[TraceRequest], mix: str, seed: int = 0) -> list[TraceRequest]:
    """Tiers in the proportions of `mix` (e.g. `strict=0.3,relaxed=0.5,background=0.2`).

    Counts are exact (largest remainder, ties to the earlier tier) and the positions are a
    seeded shuffle, so 10 requests at 0.3/0.5/0.2 get exactly 3/5/2. Weights are normalized.
    """
    pairs = [(n, float(v)) for n, v in _parse_pairs(mix, "=")]
    if not pairs or any(w < 0 for _, w in pairs) or sum(w for _, w in pairs) <= 0:
        raise ValueError(f"bad tier mix {mix!r}")
    total = sum(w for _, w in pairs)
    n = len(reqs)
    exact = [n * w / total for _, w in pairs]
    counts = [math.floor(x) for x in exact]
    by_remainder = sorted(range(len(pairs)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in by_remainder[: n - sum(counts)]:
        counts[i] += 1
    labels = [name for (name, _), c in zip(pairs, counts, strict=True) for _ in range(c)]
    random.Random(seed).shuffle(labels)
    return [replace(r, tier=t) for r, t in zip(reqs, labels, strict=True)]


def assign_by_length(reqs: list[TraceRequest], rule: str) -> list[TraceRequest]:
    """Tiers by prompt length: `strict:512,relaxed:2048,background` gives input_len <= 512
    strict, <= 2048 relaxed, and the rest background. The last entry may omit its threshold
    (a catch-all); without one, longer prompts keep their tier."""
    steps: list[tuple[str, float]] = []
    for name, val in _parse_pairs(rule, ":"):
        steps.append((name, float(val) if val else math.inf))
    if not steps or any(b <= a for (_, a), (_, b) in zip(steps, steps[1:], strict=False)):
        raise ValueError(f"bad length rule {rule!r}: thresholds must increase")
    out = []
    for r in reqs:
        tier = next((name for name, hi in steps if r.input_len <= hi), r.tier)
        out.append(replace(r, tier=tier))
    return out


def fill_default_tier(reqs: list[TraceRequest], tier: str) -> list[TraceRequest]:
    """Give `tier` to every request that has none."""
    return [r if r.tier is not None else replace(r, tier=tier) for r in reqs]
