"""Fault suite: the host worker stalls (SIGSTOP 20 s) or dies (kill -9) under 40 streaming
requests, on `nitsum serve` with its defaults (2 devices, one host worker, router defaults).

A stall is not a death: the router holds a silent worker's requests (suspect after
`heartbeat_timeout_ms`, gone only after `worker_gone_ms`), so a 20 s stall fails nothing and
every stream ends with the text it would have had. A death is not a failure either: with no
other worker, the router holds the requests until the restarted host worker registers (within
`retry_window_ms`) and resumes each from the tokens its client already has.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from fault_load import LoadResult, count_request, run_streams, wait_until
from nitsum.bench.bench_cli import discover_model
from serve_launch import serving

pytestmark = pytest.mark.slow

N = 40
MAX_TOKENS = 48
STALL_S = 20.0
STARTUP_S = 240.0


def host_worker(url: str) -> psutil.Process:
    """The host worker process of the `nitsum serve` listening at `url`."""
    port = url.rsplit(":", 1)[1]
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "serve" in cmd and "--port" in cmd and cmd[cmd.index("--port") + 1] == port:
            workers = [c for c in p.children() if "--devices" in cmdline(c)]
            assert len(workers) == 1, [cmdline(c) for c in p.children()]
            return workers[0]
    raise AssertionError(f"no nitsum serve process on port {port}")


def cmdline(p: psutil.Process) -> list[str]:
    """`p`'s command line; [] for a killed worker not yet reaped (a zombie)."""
    try:
        return p.cmdline() if p.status() != psutil.STATUS_ZOMBIE else []
    except (psutil.ZombieProcess, psutil.NoSuchProcess):
        return []


@pytest.fixture(scope="module")
def server(
    smollm2_dir: Path, nitsum_cache: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path]]:
    work = tmp_path_factory.mktemp("fault-stall")
    with serving(work, "--model", str(smollm2_dir), startup_s=STARTUP_S) as served:
        yield served


@pytest.fixture(scope="module")
def baseline(server: tuple[str, Path]) -> tuple[str, dict[int, str]]:
    """The model name and the 40 texts of an uninterrupted run."""
    url, _ = server
    model = discover_model(url, None)
    res = run_streams(url, None, bodies(model), lambda _: None)
    assert res.counts(N) == {"ok": N, "error": 0, "lost": 0}, res.outcomes
    return model, res.texts()


def bodies(model: str) -> list[dict]:
    return [count_request(model, i, MAX_TOKENS) for i in range(N)]


def all_streaming(res: LoadResult) -> None:
    wait_until("every request to stream", lambda: len(res.streaming) == N, timeout=90)


def test_a_20s_sigstop_of_the_host_worker_fails_nothing(server, baseline) -> None:
    url, log_path = server
    model, texts = baseline
    victim = host_worker(url)
    stopped: dict[str, float] = {}

    def stall(res: LoadResult) -> None:
        all_streaming(res)
        victim.send_signal(signal.SIGSTOP)
        t0 = time.monotonic()
        try:
            time.sleep(STALL_S)
            # NOTE: still in flight: each had its first token and owes MAX_TOKENS - 1 more.
            stopped["done_during_stall"] = len(res.outcomes)
        finally:
            victim.send_signal(signal.SIGCONT)
            stopped["s"] = time.monotonic() - t0

    res = run_streams(url, None, bodies(model), stall, timeout_s=150)
    assert stopped["s"] >= STALL_S
    assert stopped["done_during_stall"] == 0
    assert res.counts(N) == {"ok": N, "error": 0, "lost": 0}, res.outcomes
    assert res.texts() == texts
    # The router noticed the silence (suspect) and the worker's return; it did not restart.
    log = log_path.read_text(errors="replace")
    assert "workers missed their heartbeats" in log, log[-3000:]
    assert "suspect worker answers again" in log, log[-3000:]
    assert victim.is_running() and host_worker(url).pid == victim.pid
    # And it serves new requests as before.
    again = run_streams(url, None, bodies(model)[:4], lambda _: None)
    assert again.texts() == {i: texts[i] for i in range(4)}


def test_kill_9_of_the_host_worker_loses_and_fails_nothing(server, baseline) -> None:
    url, _ = server
    model, texts = baseline
    victim = host_worker(url)
    killed: dict[str, int] = {}

    def kill(res: LoadResult) -> None:
        all_streaming(res)
        killed["streaming"] = len(res.streaming)
        os.kill(victim.pid, signal.SIGKILL)

        # `nitsum serve` starts a new host worker, which registers its devices again.
        def replaced() -> bool:
            try:
                return host_worker(url).pid != victim.pid
            except AssertionError:  # between the death and the restart: none
                return False

        wait_until("a new host worker", replaced, timeout=30)

    t0 = time.monotonic()
    res = run_streams(url, None, bodies(model), kill, timeout_s=150)
    assert killed["streaming"] == N
    assert res.counts(N) == {"ok": N, "error": 0, "lost": 0}, (res.outcomes, time.monotonic() - t0)
    # Each resumed from the tokens its client had: the full count, the greedy text (a resumed
    # greedy request continues as the dead worker would have).
    assert res.texts() == texts
    health = httpx.get(f"{url}/health", timeout=10).json()
    assert health["workers"] == 2, health
