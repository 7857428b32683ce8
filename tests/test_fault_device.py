"""Fault suite: kill -9 one device process of `nitsum serve`'s host worker (the default for 2
CPU devices) with 40 streaming requests in flight.

The host worker tells the router at once (`device_lost`): `/health` counts 1 worker within
2 s, not after the 10 s heartbeat timeout; the dead device's requests resume on the live one
from the tokens they streamed (none lost, none failed, each text the uninterrupted greedy
answer); the host worker restarts the device, which registers again, and serves.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import httpx
import pytest

from fault_load import CHAT, LoadResult, count_request, run_streams, wait_until
from serve_launch import serving

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

MODEL = "SmolLM2-135M-Instruct"
N = 40
TOKENS = 24
REPORT_S = 2.0  # /health counts the dead device out this fast (the heartbeat timeout: 10 s)
RESTART_S = 180.0  # backoff 1 s, then the device loads the model again on a busy machine


def _device_pids(log_path: Path) -> dict[int, int]:
    """Device index -> pid of its process, from the host worker's log (the latest start)."""
    text = log_path.read_text(errors="replace")
    return {int(d): int(p) for d, p in re.findall(r"device (\d+) started \(pid (\d+)\)", text)}


def _workers(url: str) -> int:
    return int(httpx.get(f"{url}/health", timeout=10).json()["workers"])


def _metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def test_kill_a_device_process_with_40_streams_in_flight(
    smollm2_dir: Path, nitsum_cache: Path, tmp_path: Path
) -> None:
    flags = ("--model", str(smollm2_dir), "--workers", "2", "--kv-cache-mb", "128")
    with serving(tmp_path, *flags, cwd=tmp_path) as (url, log_path):
        assert "started host-worker" in log_path.read_text(), "not the default host worker"
        pids = wait_until("both devices' pids", lambda: len(_device_pids(log_path)) == 2, 30)
        pids = _device_pids(log_path)
        wait_until("2 workers", lambda: _workers(url) == 2, 30)
        report: dict[str, float] = {}

        def kill_device_1(res: LoadResult) -> None:
            # NOTE: the two devices split the streams about evenly, and one device's whole
            # batch can stream before the other's first token: only past half are both
            # devices' streams going, so the killed device has tokens to resume from.
            more_than_half = N // 2 + 1
            wait_until(
                "streams with tokens on both devices",
                lambda: len(res.streaming) >= more_than_half,
                120,
                every=0.02,
            )
            os.kill(pids[1], signal.SIGKILL)
            killed = time.monotonic()
            wait_until("/health to count the dead device out", lambda: _workers(url) == 1, 30)
            report["out_s"] = time.monotonic() - killed
            report["streaming_at_kill"] = len(res.streaming)

        bodies = [count_request(MODEL, i, TOKENS) for i in range(N)]
        res = run_streams(url, None, bodies, kill_device_1, timeout_s=240)
        counts = res.counts(N)
        print(f"killed device 1 with {report.get('streaming_at_kill')} streams going: {counts}")
        print(f"/health counted it out after {report.get('out_s', -1):.2f} s")
        bad = {i: o for i, o in res.outcomes.items() if o[0] != "ok"}
        assert counts["lost"] == 0, bad
        assert counts["error"] == 0, bad
        assert report["out_s"] < REPORT_S, report
        assert _metric(url, "nitsum_requests_resumed_total") >= 1, "no request was resumed"

        # The host worker restarted the device: it registers again and serves.
        wait_until("the restarted device to register", lambda: _workers(url) == 2, RESTART_S)
        assert _device_pids(log_path)[1] != pids[1]
        log = log_path.read_text(errors="replace")
        assert "restarting device 1" in log and "device 1 is back" in log, log[-3000:]
        http = httpx.Client(base_url=url, timeout=120)
        for i in range(8):
            r = http.post(CHAT, json=count_request(MODEL, i, TOKENS) | {"stream": False})
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["completion_tokens"] == TOKENS

        # No token lost or repeated: every text (resumed ones included) is the greedy answer.
        def reference(i: int) -> str:
            r = http.post(CHAT, json=count_request(MODEL, i, TOKENS) | {"stream": False})
            assert r.status_code == 200, r.text
            return str(r.json()["choices"][0]["message"]["content"])

        texts = res.texts()
        refs = {i: reference(i) for i in texts}
        differ = {i: (texts[i], refs[i]) for i in texts if texts[i] != refs[i]}
        assert not differ, differ
