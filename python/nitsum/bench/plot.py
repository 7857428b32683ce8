"""Plots: goodput vs request rate (one line per results file) and the plan timeline.

matplotlib with the Agg backend (no display needed), imported when a plot is drawn
(pyplot.py: it is in the `bench` extra). The data preparation is in pure
functions (`goodput_points`, `plan_segments`) so it can be tested without looking at images.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nitsum.bench.pyplot import pyplot

ROLE_COLORS = {"prefill": "tab:blue", "decode": "tab:orange", "mixed": "tab:green"}


def load_results(path: str | Path) -> dict[str, Any]:
    """A results file written by `nitsum bench --out`."""
    return json.loads(Path(path).read_text())


def goodput_points(results: dict[str, Any], tier: str | None = None) -> list[tuple[float, float]]:
    """(offered request rate, goodput) per run, sorted by rate; per `tier` when given."""
    pts = []
    for run in results["runs"]:
        s = run["summary"]
        g = s["goodput"] if tier is None else s["tiers"][tier]["goodput"]
        pts.append((s["request_rate"], g))
    return sorted(pts)


def plot_goodput_vs_rate(results: list[str | Path | dict[str, Any]], out: str | Path) -> None:
    """One line per results file or dict (labelled by its `label`, else the file name), with
    the ideal goodput = rate as a dashed reference."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    ideal: list[tuple[float, float]] = []
    for i, f in enumerate(results):
        res = f if isinstance(f, dict) else load_results(f)
        default = f"run {i}" if isinstance(f, dict) else Path(f).stem
        pts = goodput_points(res)
        ax.plot(*zip(*pts, strict=True), marker="o", label=res.get("label") or default)
        if not ideal:
            # NOTE: background requests are offered load but never goodput, so the ceiling is
            # the rate of SLO-tier requests, not y = x.
            runs = [r["summary"] for r in res["runs"]]
            ideal = sorted((s["request_rate"], s["slo_request_rate"]) for s in runs)
    if ideal:
        ax.plot(
            *zip((0.0, 0.0), *ideal, strict=True),
            linestyle="--",
            color="gray",
            linewidth=0.8,
            label="ideal: every SLO-tier request good",
        )
    ax.set_xlabel("offered load (requests/s)")
    ax.set_ylabel("goodput (requests/s meeting TTFT and TPOT)")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


@dataclass(frozen=True, slots=True)
class Segment:
    """Device `device` was in a group of TP `tp` with role `role` during [start, end)."""

    device: int
    start: float
    end: float
    tp: int
    role: str


def plan_segments(entries: list[dict[str, Any]], tail_s: float | None = None) -> list[Segment]:
    """Per device, maximal time spans with the same (tp, role).

    A sample holds until the next one; the last holds for `tail_s` (default: the median
    polling interval, or 1 s with a single sample). Devices absent from a plan get no span.
    """
    if not entries:
        return []
    entries = sorted(entries, key=lambda e: e["t"])
    gaps = sorted(b["t"] - a["t"] for a, b in zip(entries, entries[1:], strict=False))
    if tail_s is None:
        tail_s = gaps[len(gaps) // 2] if gaps else 1.0
    ends = [e["t"] for e in entries[1:]] + [entries[-1]["t"] + tail_s]
    open_: dict[int, Segment] = {}
    done: list[Segment] = []
    for e, end in zip(entries, ends, strict=True):
        seen = set()
        for g in e["groups"]:
            for d in g["members"]:
                seen.add(d)
                cur = open_.get(d)
                if cur is not None and (cur.tp, cur.role) == (g["tp"], g["role"]):
                    open_[d] = Segment(d, cur.start, end, cur.tp, cur.role)
                else:
                    if cur is not None:
                        done.append(cur)
                    open_[d] = Segment(d, e["t"], end, g["tp"], g["role"])
        for d in [d for d in open_ if d not in seen]:
            done.append(open_.pop(d))
    done.extend(open_.values())
    return sorted(done, key=lambda s: (s.device, s.start))


def plot_plan_timeline(entries: list[dict[str, Any]], out: str | Path) -> None:
    """One row per device; bars colored by role and labelled with the TP level."""
    segs = plan_segments(entries)
    devices = sorted({s.device for s in segs})
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 1 + 0.4 * max(len(devices), 1)))
    for s in segs:
        y = devices.index(s.device)
        ax.broken_barh(
            [(s.start, s.end - s.start)], (y - 0.4, 0.8), color=ROLE_COLORS.get(s.role, "tab:gray")
        )
        ax.text((s.start + s.end) / 2, y, f"TP{s.tp}", ha="center", va="center", fontsize=7)
    ax.set_yticks(range(len(devices)), [f"dev {d}" for d in devices])
    ax.set_xlabel("time since run start (s)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in ROLE_COLORS.values()]
    ax.legend(handles, list(ROLE_COLORS), loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=7)
    ax.set_title("plan timeline (role and TP level per device)")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
