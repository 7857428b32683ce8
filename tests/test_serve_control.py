"""`nitsum serve` on the embedded model plans per window by default; `--no-control` stops it.

Real router, real CPU workers on the embedded SmolLM2-135M, started from a directory without
`profiles/` (the shipped profile must be found from the package). Every wait is bounded and
the server's whole session is SIGKILLed at teardown.
"""

from __future__ import annotations

import contextlib
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from nitsum.bench.bench_cli import discover_model
from nitsum.control_profile import SHIPPED_PROFILES
from serve_launch import serving

pytestmark = pytest.mark.slow

SHIPPED = SHIPPED_PROFILES / "cpu-2core-SmolLM2-135M-Instruct.json"
STARTUP_S = 180.0


def serving_in(work: Path, *flags: str) -> contextlib.AbstractContextManager[tuple[str, Path]]:
    """`nitsum serve FLAGS` run from `work` (so nothing under ./profiles is found by accident)."""
    return serving(work, "--kv-cache-mb", "128", *flags, startup_s=STARTUP_S, cwd=work)


def load(url: str, tier: str, n: int) -> list[int]:
    """`n` small concurrent completions of `tier`; their HTTP status codes."""

    model = discover_model(url, None)

    def one(i: int) -> int:
        body = {"model": model, "prompt": [1000 + i] * 24, "max_tokens": 4, "ignore_eos": True}
        r = httpx.post(
            f"{url}/v1/completions", json=body, headers={"x-nitsum-tier": tier}, timeout=60
        )
        return r.status_code

    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(one, range(n)))


def applied_rounds_with(url: str, tier: str, timeout: float) -> list[dict]:
    """Applied control rounds whose demand snapshot saw `tier` arrive (waits up to `timeout`)."""
    deadline = time.monotonic() + timeout
    while True:
        history = httpx.get(f"{url}/admin/plan", timeout=10).json()["history"]
        rounds = [
            h
            for h in history
            if h["result"] == "applied"
            and any(d["tier"] == tier and d["rate_rps"] > 0 for d in h["demand"])
        ]
        if rounds or time.monotonic() > deadline:
            return rounds
        time.sleep(0.5)


def test_default_serve_runs_the_control_loop_on_the_shipped_profile(
    smollm2_dir: Path, nitsum_cache: Path, tmp_path: Path
) -> None:
    assert not (tmp_path / "profiles").exists()
    with serving_in(tmp_path) as (
        url,
        log_path,
    ):  # no flags: the README's command
        log = log_path.read_text()
        assert f"control loop on: planning every window with {SHIPPED}" in log, log[-3000:]
        assert f"--profile {SHIPPED}" in log  # passed to the router
        assert "started host-worker" in log and "--devices 2" in log, log[-3000:]
        plan = httpx.get(f"{url}/admin/plan", timeout=10).json()
        assert plan["control"] is True, plan
        assert sorted(m for g in plan["groups"] for m in g["members"]) == [0, 1], plan
        assert all(g["tp"] == 1 for g in plan["groups"]), plan  # 2 devices: TP 3 cannot fit
        assert load(url, "relaxed", 8) == [200] * 8
        rounds = applied_rounds_with(url, "relaxed", timeout=20)  # a window is 1 s
        assert rounds, httpx.get(f"{url}/admin/plan", timeout=10).json()
        planned = rounds[-1]["groups"]
        assert sorted(m for g in planned for m in g["members"]) == [0, 1], planned
        assert any("relaxed" in g["tiers"] or not g["tiers"] for g in planned), planned
        plan = httpx.get(f"{url}/admin/plan", timeout=10).json()
        assert plan["epoch"] >= rounds[-1]["epoch"], plan


def test_no_control_flag_keeps_the_static_plan(
    smollm2_dir: Path, nitsum_cache: Path, tmp_path: Path
) -> None:
    with serving(
        tmp_path,
        "--workers",
        "1",
        "--no-control",
        "--kv-cache-mb",
        "128",
        startup_s=STARTUP_S,
        cwd=tmp_path,
    ) as (url, log_path):
        log = log_path.read_text()
        assert "control loop off (--no-control)" in log, log[-3000:]
        assert "--profile" not in log
        assert load(url, "relaxed", 4) == [200] * 4
        time.sleep(2.5)  # two control windows, were there a loop
        plan = httpx.get(f"{url}/admin/plan", timeout=10).json()
        assert plan["control"] is False, plan
        assert plan["history"] == [], plan
        assert [g["members"] for g in plan["groups"]] == [[0]], plan
