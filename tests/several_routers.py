"""Fixtures for several routers in front of one pool: N real `nitsum-router` processes that
share a planning lease, real `WorkerServer`s over echo backends registered with every one of
them, streaming clients, a throw-away etcd, and a fake deposed leader.

Every wait is bounded, so a regression fails in seconds instead of hanging.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from nitsum.worker.handshake import new_nonce, router_proof
from plane import SECRET, FakeRouter, RealWorker, Router, wait
from test_router_protocol import free_port

# A profile the control loop plans TP-1 groups with (the echo backend serves TP 1 only).
PROFILE = {
    "schema": "nitsum-profile/1",
    "device": "synthetic",
    "model": "synthetic",
    "analytic": True,
    "tp_levels": [1],
    "prefill": {"1": [{"tokens": 1, "ms": 1.0}, {"tokens": 1001, "ms": 30.0}]},
    "decode": {
        "1": [{"batch": 1, "context": 64, "ms": 5.0}, {"batch": 128, "context": 64, "ms": 20.0}]
    },
}


def start_routers(tmp: Path, n: int, lease: str, window_ms: int, routers: list[Router]) -> None:
    """Add `n` routers (indices 0..n-1) to `routers`, with the control loop and the shared
    `lease`; router 0 first, so it takes the lease."""
    (tmp / "profile.json").write_text(json.dumps(PROFILE))
    for i in range(n):
        extra = ["--profile", str(tmp / "profile.json"), "--control-window-ms", str(window_ms)]
        extra += ["--lease", lease, "--router-index", str(i)]
        routers.append(Router(tmp, log_level="info", extra_args=extra, log_name=f"router{i}.log"))
        if i == 0:
            wait(lambda: plan_of(routers[0])["router"]["role"] == "leader", what="router 0 leads")


def plan_of(router: Router) -> dict[str, Any]:
    """Its `/admin/plan` JSON."""
    return httpx.get(f"{router.http}/admin/plan", timeout=2).json()


class Workers:
    """`n` real worker servers (echo backends, one device each) for every router."""

    def __init__(self, routers: list[Router], n: int, delay: float) -> None:
        addrs = [r.addr for r in routers]
        self.workers = [
            RealWorker(addrs, w, delay, register_every_s=0.3, registered=False) for w in range(n)
        ]
        self.servers = [w.server for w in self.workers]

    def wait_registered(self) -> None:
        wait(lambda: all(s.registered for s in self.servers), what="workers registered")

    def stop(self) -> None:
        for w in self.workers:
            w.stop()


class Deployment:
    """Routers and workers of one test, all stopped by `stop` (the fixture's teardown), also
    when the test fails half-way."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.routers: list[Router] = []
        self.workers: Workers | None = None

    def start(self, lease: str, window_ms: int, routers: int = 2, workers: int = 2) -> None:
        """The routers (router 0 leading), then the workers registered with all of them."""
        start_routers(self.tmp, routers, lease, window_ms, self.routers)
        self.workers = Workers(self.routers, workers, delay=0.02)
        self.workers.wait_registered()

    def stop(self) -> None:
        if self.workers is not None:
            self.workers.stop()
        for r in self.routers:
            r.stop()


def echo(prompt: list[int], n: int) -> list[int]:
    """What the echo backend answers `prompt` with in `n` tokens."""
    return [prompt[i % len(prompt)] for i in range(n)]


class Stream:
    """One streaming `/generate` in a thread: its chunks, its last `output_ids`, how it ended."""

    def __init__(self, base: str, prompt: list[int], n: int) -> None:
        self.chunks = 0
        self.ids: list[int] = []
        self.finish: str | None = None
        self.error: str | None = None
        body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": n}, "stream": True}
        self.thread = threading.Thread(target=self._run, args=(base, body), daemon=True)
        self.thread.start()

    def _run(self, base: str, body: dict[str, Any]) -> None:
        try:
            with httpx.stream("POST", f"{base}/generate", json=body, timeout=30) as r:
                for line in r.iter_lines():
                    data = line.removeprefix("data:").strip()
                    if not line.startswith("data:") or data == "[DONE]":
                        continue
                    chunk = json.loads(data)
                    if "error" in chunk:
                        self.error = str(chunk["error"])
                        return
                    self.chunks += 1
                    self.ids = chunk["output_ids"]
                    self.finish = (chunk["meta_info"].get("finish_reason") or {}).get("type")
        except httpx.HTTPError as e:
            self.error = f"{type(e).__name__}: {e}"

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "a stream did not end"


class FakeLeader(FakeRouter):
    """A deposed leader back at its old worker endpoint: a ROUTER socket that proves the
    worker secret in the handshake, accepts each worker and sends it a plan of its old term."""

    def __init__(self, addr: str) -> None:
        super().__init__(addr, secret=SECRET.encode())
        self.acks: dict[int, dict[str, Any]] = {}

    def serve(self, epoch: int, workers: int, timeout: float = 15.0) -> None:
        """Handshake with every worker, then send `reconfigure` under `epoch`; collect acks."""
        deadline = time.monotonic() + timeout
        while len(self.acks) < workers:
            assert time.monotonic() < deadline, f"acks of the stale plan: {self.acks}"
            got = self.recv(0.1)
            if got is None:
                continue
            peer, msg = got
            w = msg.get("worker_id")
            if msg["type"] == "hello":
                nonce = new_nonce()
                proof = router_proof(SECRET.encode(), msg["nonce"], nonce, w)
                self.send(
                    peer, type="challenge", worker_id=w, handshake=3, nonce=nonce, proof=proof
                )
            elif msg["type"] == "register":
                self.send(peer, type="registered", worker_id=w, epoch=epoch - 1)
                group = {"members": [w], "tp": 1, "role": "mixed", "tiers": []}
                group["accepts_background"] = False
                self.send(peer, type="reconfigure", epoch=epoch, groups=[group])
            elif msg["type"] == "reconfigured":
                self.acks[w] = msg


class Etcd:
    """A throw-away single-member etcd (Debian's `etcd-server`) on free loopback ports, with
    fast elections so that a 1 s lease TTL is allowed."""

    def __init__(self, tmp: Path) -> None:
        client, peer = free_port(), free_port()
        self.url = f"http://127.0.0.1:{client}"
        peer_url = f"http://127.0.0.1:{peer}"
        args = ["etcd", "--name", "t", "--data-dir", str(tmp / "etcd")]
        args += ["--listen-client-urls", self.url, "--advertise-client-urls", self.url]
        args += ["--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url]
        args += ["--initial-cluster", f"t={peer_url}"]
        args += ["--heartbeat-interval", "25", "--election-timeout", "250"]
        log = (tmp / "etcd.log").open("wb")
        self.proc = subprocess.Popen(args, stdout=log, stderr=log)
        wait(self.healthy, timeout=20, what="etcd up")

    @staticmethod
    def installed() -> bool:
        return shutil.which("etcd") is not None

    def healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=1).json().get("health") == "true"
        except (httpx.HTTPError, ValueError):
            return False

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(5)
