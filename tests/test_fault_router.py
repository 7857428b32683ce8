"""Fault suite: `kill -9` the router under `nitsum serve` with 40 streaming requests in flight.

What a client sees (docs/serving.md, "When the router dies"): every stream open on the killed
router is cut (its socket dies with the process; no error event can be written); requests
sent while it is down are refused at connect. `nitsum serve` stays up and restarts the router;
the workers re-register within seconds and abort the orphaned requests (no KV stays held by a
request nobody reads); new requests succeed.

Marked slow: it starts the router and 2 CPU workers on the embedded model.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import httpx
import pytest

from fault_load import count_request, run_streams, wait_until
from serve_launch import serving

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

MODEL = "SmolLM2-135M-Instruct"
N_STREAMS = 40
WORKERS = 2


def router_pids(log: Path) -> list[int]:
    """Pids of every router `nitsum serve` started, in order (worker/children.py logs them)."""
    return [int(p) for p in re.findall(r"started router \(pid (\d+)\)", log.read_text())]


def engine_busy(base: str) -> float | None:
    """Running + waiting requests the workers report (their heartbeats, summed by the router's
    /metrics); None while it does not answer or reports no engine numbers yet."""
    try:
        text = httpx.get(f"{base}/metrics", timeout=5).text
    except httpx.HTTPError:
        return None
    values = [
        float(m.group(1))
        for name in ("vllm:num_requests_running", "vllm:num_requests_waiting")
        for m in re.finditer(rf"^{re.escape(name)}{{[^}}]*}} ([0-9.e+-]+)$", text, re.M)
    ]
    return sum(values) if values else None


def health_workers(base: str) -> int:
    try:
        body = httpx.get(f"{base}/health", timeout=2).json()
    except (httpx.HTTPError, ValueError):
        return -1
    return int(body.get("workers", -1)) if isinstance(body, dict) else -1


def test_kill_9_router_under_serve_with_40_streams(tmp_path: Path) -> None:
    flags = ["--workers", str(WORKERS), "--no-control", "--no-tp-switching", "--threads", "1"]
    with serving(tmp_path, *flags) as (base, log):
        first = router_pids(log)
        assert len(first) == 1
        killed_at: list[float] = []

        def kill_router(res) -> None:  # noqa: ANN001 - fault_load.LoadResult
            wait_until("5 streams to have a first token", lambda: len(res.streaming) >= 5, 120)
            os.kill(first[0], signal.SIGKILL)
            killed_at.append(time.monotonic())

        # Long answers: orphans left running on the workers would stay visible for minutes.
        bodies = [count_request(MODEL, i, max_tokens=400) for i in range(N_STREAMS)]
        res = run_streams(base, None, bodies, kill_router, timeout_s=60)
        counts = res.counts(N_STREAMS)
        print(f"router kill -9 with {N_STREAMS} streams: {counts}")
        # Streams open on the killed router are cut (no process is left to write an error).
        assert counts["ok"] == 0, counts
        assert counts["lost"] + counts["error"] == N_STREAMS

        # nitsum serve restarts the router (backoff 1 s) and the workers re-register.
        wait_until("a second router", lambda: len(router_pids(log)) == 2, 30)
        wait_until("the workers to re-register", lambda: health_workers(base) == WORKERS, 30)
        back_s = time.monotonic() - killed_at[0]
        print(f"workers re-registered {back_s:.1f} s after the kill")
        assert back_s < 15
        # The orphans were aborted (worker/registration.py: on `reregister`, or on a fresh
        # `registered`): the engines hold nothing once the heartbeats report. Left running,
        # 40 answers of 400 tokens would keep them busy for minutes.
        time.sleep(2.0)  # NOTE: heartbeats (every 0.5 s) carry the engines' numbers
        wait_until(
            "the workers to report no running or waiting request",
            lambda: engine_busy(base) == 0.0,
            20,
            every=0.5,
        )

        # New requests succeed, on the restarted router.
        again = run_streams(
            base, None, [count_request(MODEL, i, 8) for i in range(4)], lambda _: None, 120
        )
        assert again.counts(4) == {"ok": 4, "error": 0, "lost": 0}, again.outcomes


def test_sigterm_router_ends_open_streams_with_an_error_event(tmp_path: Path) -> None:
    """The router's graceful end (SIGTERM: drain, then fail what is left) never cuts a stream:
    each gets an SSE `error` event naming the shutdown (then `[DONE]`, api/sse.rs)."""
    config = tmp_path / "router.json"
    config.write_text('{"drain_timeout_ms": 300}')
    flags = ["--workers", "1", "--no-control", "--threads", "1", "--config", str(config)]
    with serving(tmp_path, *flags) as (base, log):
        router = router_pids(log)[0]

        def stop_router(res) -> None:  # noqa: ANN001 - fault_load.LoadResult
            wait_until("a stream to have a first token", lambda: len(res.streaming) >= 1, 120)
            os.kill(router, signal.SIGTERM)

        bodies = [count_request(MODEL, i, max_tokens=400) for i in range(8)]
        res = run_streams(base, None, bodies, stop_router, timeout_s=60)
        counts = res.counts(8)
        print(f"router SIGTERM with 8 streams: {counts}")
        assert counts == {"ok": 0, "error": 8, "lost": 0}, res.outcomes
        assert all("shut down" in why for _, why in res.outcomes.values()), res.outcomes
        # ... and nitsum serve starts it again.
        wait_until("a second router", lambda: len(router_pids(log)) == 2, 30)
        wait_until("the worker to re-register", lambda: health_workers(base) == 1, 30)
