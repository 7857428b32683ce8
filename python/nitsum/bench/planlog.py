"""Plan timeline: poll the router's `/admin/plan` during a run and keep what it said when.

An entry is `{"t": seconds since run start, "epoch": int, "groups": [{"members": [0, 1],
"tp": 2, "role": "prefill" | "decode" | "mixed", "tiers": ["strict"], ...}]}`; the router
returns the same object without `t`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx


async def poll_plan(
    client: httpx.AsyncClient,
    url: str,
    clock: Callable[[], float],
    interval_s: float,
    stop: asyncio.Event,
    out: list[dict[str, Any]],
) -> None:
    """Append one entry to `out` every `interval_s` until `stop` is set.

    NOTE: pass a client of its own, so that a saturated request pool never delays the polls.
    A failed poll is skipped (the timeline just has a gap); it never fails the run.
    """
    while not stop.is_set():
        t = clock()
        try:
            resp = await client.get(url)
            if resp.status_code == 200:
                plan = resp.json()
                out.append({"t": t, "epoch": plan.get("epoch"), "groups": plan["groups"]})
        except (httpx.HTTPError, ValueError, KeyError, AttributeError):
            pass
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=interval_s)


def save_plan_log(path: str | Path, entries: list[dict[str, Any]]) -> None:
    """Write a timeline as JSON lines (one plan entry per line)."""
    with Path(path).open("w") as f:
        for e in entries:
            f.write(json.dumps(e) + "\n")


def load_plan_log(path: str | Path) -> list[dict[str, Any]]:
    """Read a timeline written by `save_plan_log` (or a JSON list of entries)."""
    text = Path(path).read_text()
    if text.lstrip().startswith("["):
        return list(json.loads(text))
    return [json.loads(line) for line in text.splitlines() if line.strip()]
