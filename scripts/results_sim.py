"""Simulation runs for results.py: every policy at one load point, best-k picks and ratios.

One `Point` task runs Nitsum, its fixed-TP ablation and static TP-k at every TP level that
fits, and Split, on the same requests (`nitsum._core.simulate`, records off). Tasks are
independent, so `run_points` can spread them over processes; the results do not depend on it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from nitsum import _core

# `nitsum simulate` defaults (docs/planner.md); the page's method text quotes them.
SIM_DEFAULTS = {"window_s": 1.0, "switch_ms": 5.0, "target_utilization": 0.5, "seed": 0}


@dataclass(frozen=True)
class Point:
    """One load point of one sweep: `reqs` are already rate-scaled."""

    sweep: str
    rate_scale: float
    profile: dict
    tiers: list[dict]
    reqs: list[dict]
    devices: int
    keep_timeline: bool = False


def policies(levels: list[int], devices: int) -> list[tuple[str, dict]]:
    """(name, policy) for every policy of the sweep at this pool size."""
    ok = [t for t in levels if t <= devices]
    out: list[tuple[str, dict]] = [("nitsum", {"kind": "nitsum"})]
    out.append(("nitsum-greedy", {"kind": "nitsum_greedy"}))
    out += [(f"fixed-tp{t}", {"kind": "nitsum_fixed_tp", "tp": t}) for t in ok]
    out += [(f"static-tp{t}", {"kind": "static_tp", "tp": t}) for t in ok]
    out.append(("split", {"kind": "split"}))
    return out


def simulate(point: Point, policy: dict, timeline: bool) -> dict[str, Any]:
    """One `nitsum simulate` run (the CLI's defaults), summarized; `timeline` kept on demand."""
    cfg = {
        "profile": point.profile,
        "tiers": point.tiers,
        "devices": point.devices,
        "policy": policy,
        "requests": point.reqs,
        "records": False,
        **SIM_DEFAULTS,
    }
    r = json.loads(_core.simulate(json.dumps(cfg)))
    out = {
        "goodput_rps": r["goodput_rps"],
        "attainment": r["attainment"],
        "duration_s": r["duration_s"],
        "requests": r["requests"],
        "reconfigurations": r["reconfigurations"],
        "devices_moved": r.get("devices_moved"),
        "per_tier": {
            name: {
                "requests": t["requests"],
                "attainment": t["attainment"],
                "goodput_rps": t["goodput_rps"],
                "dropped": t["dropped"],
                "ttft_p90_ms": t["ttft_ms"].get("p90"),
                "tpot_p90_ms": t["tpot_ms"].get("p90"),
            }
            for name, t in r["per_tier"].items()
        },
    }
    if timeline:
        out["timeline"] = r.get("timeline", [])
    return out


def best_of(runs: dict[str, dict], prefix: str) -> str:
    """The name of the best run among names starting with `prefix` (ties: lower TP)."""
    names = [n for n in runs if n.startswith(prefix)]
    return max(names, key=lambda n: (runs[n]["goodput_rps"], -int(n.rsplit("tp", 1)[1])))


def run_point(point: Point) -> dict[str, Any]:
    """Every policy at `point`, with the best fixed/static k and Nitsum's ratios."""
    t0 = time.perf_counter()
    runs = {
        name: simulate(point, pol, point.keep_timeline and name == "nitsum")
        for name, pol in policies(point.profile["tp_levels"], point.devices)
    }
    fixed, static = best_of(runs, "fixed-tp"), best_of(runs, "static-tp")
    nitsum = runs["nitsum"]["goodput_rps"]
    best = max(runs[n]["goodput_rps"] for n in (fixed, static, "split"))
    n_all = len(point.reqs)
    dur = runs["nitsum"]["duration_s"]
    return {
        "rate_scale": point.rate_scale,
        "offered_rps": n_all / dur,
        "offered_slo_rps": runs["nitsum"]["requests"] / dur,
        "duration_s": dur,
        "best_fixed": fixed,
        "best_static": static,
        "nitsum_over_best": nitsum / best if best > 0 else None,
        "nitsum_over_fixed": (
            nitsum / runs[fixed]["goodput_rps"] if runs[fixed]["goodput_rps"] > 0 else None
        ),
        "wall_s": round(time.perf_counter() - t0, 2),
        "runs": runs,
    }


def run_points(
    points: list[Point], jobs: int, done: Callable[[Point, dict], None]
) -> Iterator[tuple[Point, dict]]:
    """Run every point (in `jobs` processes when > 1); yields in the order given."""
    if jobs <= 1:
        for p in points:
            res = run_point(p)
            done(p, res)
            yield p, res
        return
    with ProcessPoolExecutor(jobs) as pool:
        futures = [pool.submit(run_point, p) for p in points]
        for p, f in zip(points, futures, strict=True):
            res = f.result()
            done(p, res)
            yield p, res
