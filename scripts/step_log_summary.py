"""Summarize a step log (`NITSUM_STEP_LOG`, engine/step_log.py): where a served load's time
went, step by step, against what the steps would cost at the profiled rates.

usage: python scripts/step_log_summary.py STEPS.jsonl [--window 5] [--profile PROFILE.json]

Prints per time window: steps, step-call time and the gaps between calls (the worker's own
work), rows, prefill tokens per second, running / waiting sequences, free pages,
preemptions; then a least-squares fit of a step's time on its decode rows and prefill tokens
(ms = a + b·decode + c·prefill_tokens), which says what a prefill token and a decode row
cost in serving, beside the profile's prefill rate when `--profile` names one.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np


def load(path: Path) -> list[dict[str, Any]]:
    """The log's lines (a torn last line, from a killed server, is skipped)."""
    rows = []
    for text in path.read_text().splitlines():
        try:
            rows.append(json.loads(text))
        except json.JSONDecodeError:
            continue
    return rows


def windows(rows: list[dict[str, Any]], width: float) -> list[str]:
    """One line per `width` seconds of the log."""
    groups: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[int(r["t"] // width)].append(r)
    out = [
        "   t s  steps  step ms  gap ms  busy%  rows  decode  prefill tok/s  running  waiting"
        "  free pages  preempted  waited%"
    ]
    for k in sorted(groups):
        g = groups[k]
        ms = sum(r["ms"] for r in g)
        gap = sum(r["gap_ms"] or 0.0 for r in g)
        waited = sum(r["waited_ms"] for r in g)
        out.append(
            f"{k * width:6.0f} {len(g):6d} {ms / len(g):8.2f} {gap / len(g):7.2f}"
            f" {100 * ms / (width * 1e3):5.0f}% {np.mean([r['rows'] for r in g]):5.0f}"
            f" {np.mean([r['decode'] for r in g]):7.0f}"
            f" {sum(r['prefill_tokens'] for r in g) / width:14.0f}"
            f" {np.mean([r['running'] for r in g]):8.0f} {np.mean([r['waiting'] for r in g]):8.0f}"
            f" {min(r['free_pages'] for r in g):11d} {sum(r['preempted'] for r in g):10d}"
            f" {100 * waited / max(ms, 1e-9):7.0f}%"
        )
    return out


def _ran(r: dict[str, Any]) -> tuple[int, int]:
    """(decode rows, prefill tokens) of what the device ran in this line's time: the applied
    batch of an overlapped step (NOTE: its `ms` waits for that one), else the scheduled."""
    if "applied_decode" in r:
        return r["applied_decode"], r["applied_prefill_tokens"]
    return r["decode"], r["prefill_tokens"]


def fit(rows: list[dict[str, Any]]) -> tuple[float, float, float] | None:
    """(a, b, c) of ms = a + b·decode + c·prefill_tokens over the steps that ran a batch."""
    used = [r for r in rows if sum(_ran(r)) > 0]
    if len(used) < 3:
        return None
    x = np.array([[1.0, *_ran(r)] for r in used])
    y = np.array([r["ms"] for r in used])
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    return float(coef[0]), float(coef[1]), float(coef[2])


def profile_prefill_ms_per_token(path: Path) -> float | None:
    """The profile's TP-1 prefill cost per token at its largest measured prompt."""
    prof = json.loads(path.read_text())
    points = prof.get("prefill", {}).get("1") or []
    if not points:
        return None
    top = max(points, key=lambda p: p["tokens"])
    return float(top["ms"]) / float(top["tokens"])


def summary(rows: list[dict[str, Any]], width: float, profile: Path | None) -> list[str]:
    """The printed report."""
    if not rows:
        return ["no steps logged"]
    pids = Counter(r.get("pid") for r in rows)
    head: list[str] = []
    if len(pids) > 1:  # several worker processes wrote here: the busiest one
        pid = pids.most_common(1)[0][0]
        rows = [r for r in rows if r.get("pid") == pid]
        head = [f"{len(pids)} processes wrote this log; process {pid} alone below"]
    span = rows[-1]["t"] + rows[-1]["ms"] / 1e3 - rows[0]["t"]
    ms = sum(r["ms"] for r in rows)
    gap = sum(r["gap_ms"] or 0.0 for r in rows)
    idle = [r for r in rows if r["rows"] == 0]
    out = [
        *head,
        f"{len(rows)} steps over {span:.1f} s: step calls {ms / 1e3:.1f} s, gaps between them "
        f"{gap / 1e3:.1f} s; {len(idle)} calls scheduled nothing",
        f"prefill tokens {sum(r['prefill_tokens'] for r in rows)}, decode rows "
        f"{sum(r['decode'] for r in rows)}, preemptions {sum(r['preempted'] for r in rows)}",
        "",
        *windows(rows, width),
    ]
    coef = fit(rows)
    if coef is not None:
        a, b, c = coef
        out += [
            "",
            f"fit: step ms = {a:.2f} + {b * 1e3:.1f} us/decode row"
            f" + {c * 1e3:.2f} us/prefill token",
        ]
        if profile is not None:
            per = profile_prefill_ms_per_token(profile)
            if per is not None:
                out.append(
                    f"profile: {per * 1e3:.2f} us/prefill token: serving costs {c / per:.2f}x that"
                )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("log", type=Path)
    ap.add_argument("--window", type=float, default=5.0, help="seconds per line")
    ap.add_argument("--profile", type=Path, default=None, help="a nitsum-profile/1 JSON")
    args = ap.parse_args(argv)
    print("\n".join(summary(load(args.log), args.window, args.profile)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
