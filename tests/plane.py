"""Fixtures for the worker-plane attack suite: the real `nitsum-router` binary, a real
`WorkerServer` over an echo backend (deterministic answers, no model), and attacker peers.

Every wait here is bounded, so a regression fails in seconds instead of hanging.
"""

from __future__ import annotations

import faulthandler
import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import zmq

from nitsum.engine.request_output import RequestOutput
from nitsum.worker.assignment import LocalPlan
from nitsum.worker.bind_decision import BindDecision
from nitsum.worker.device_watch import DeviceEvents
from nitsum.worker.handshake import new_nonce, worker_proof
from nitsum.worker.inbound import GenerateRequest
from nitsum.worker.server import WorkerServer
from sealing import RouterEnds, WorkerEnd
from test_router_protocol import BIN, EOS, free_port, write_tiny_model

SECRET = "attack-suite-secret-0123456789abcdef"
MODEL = "tiny"


@contextmanager
def bounded_run(seconds: float) -> Iterator[None]:
    """NOTE: bounds a test: a hang dumps every thread's stack and ends the run after `seconds`."""
    faulthandler.dump_traceback_later(seconds, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def wait(cond: Callable[[], object], timeout: float = 10.0, what: str = "condition") -> None:
    """Poll `cond` every 20 ms; AssertionError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"{what}: not reached in {timeout} s"
        time.sleep(0.02)


class EchoBackend:
    """One device that answers a prompt by echoing its ids cyclically, one token per step of
    `delay` seconds; records every request id it was given."""

    def __init__(self, worker_id: int = 0, delay: float = 0.0) -> None:
        self.device_ids = [worker_id]
        self.tp_levels = (1,)
        self.max_batch = 64
        self.delay = delay
        self.reqs: dict[str, tuple[list[int], int, int]] = {}  # id -> (prompt, max, produced)
        self.seen_ids: list[str] = []

    def capacity(self) -> tuple[int, int, list[int]]:
        return 4096, 256, [EOS]

    def register_shape(self, device: int) -> tuple[list[int], int]:
        return [1], device  # TP 1, its own domain

    def device_events(self) -> DeviceEvents:
        return DeviceEvents()  # one device in this process: it cannot die alone

    def load(self, device: int) -> tuple[int, int, int]:
        return len(self.reqs), 0, 100

    def add(self, device: int, req: GenerateRequest) -> None:
        self.seen_ids.append(req.request_id)
        self.reqs[req.request_id] = (list(req.input_ids), req.spec.sampling.max_tokens, 0)

    def abort(self, request_id: str) -> None:
        self.reqs.pop(request_id, None)

    def has_unfinished(self) -> bool:
        return bool(self.reqs)

    def step(self) -> list[RequestOutput]:
        time.sleep(self.delay)
        outs = []
        for rid, (ids, most, done) in list(self.reqs.items()):
            tok = ids[done % len(ids)]
            end = "length" if done + 1 >= most else None
            outs.append(RequestOutput(rid, [tok], end))
            self.reqs[rid] = (ids, most, done + 1)
            if end:
                del self.reqs[rid]
        return outs

    def running(self) -> list[str]:
        return list(self.reqs)

    def requests(self) -> list[str]:
        return list(self.reqs)

    def reconfigure(self, plan: LocalPlan) -> dict[str, float]:
        return {}

    def counters(self) -> dict[str, int]:
        return {}

    def last_bind(self) -> BindDecision | None:
        return None

    def moved(self) -> tuple[list[str], list[tuple[str, int, int]]]:
        return [], []  # one process: nothing is handed to or from another


class Router:
    """`nitsum-router` on free loopback ports with the shared secret in its environment."""

    def __init__(
        self,
        tmp: Path,
        config: dict[str, Any] | None = None,
        log_level: str = "error",
        extra_args: list[str] | None = None,
        log_name: str = "router.log",
    ) -> None:
        """`log_level` other than "error": the router's log goes to `self.log` (a file, named
        `log_name` in `tmp`). `extra_args`: more router flags."""
        write_tiny_model(tmp)
        self.http = f"http://127.0.0.1:{free_port()}"
        self.addr = f"tcp://127.0.0.1:{free_port()}"
        self.args = [str(BIN), "--listen", self.http.removeprefix("http://")]
        self.args += ["--worker-addr", self.addr, "--model-dir", str(tmp)]
        self.args += ["--served-model-name", MODEL, "--log-level", log_level]
        self.log: Path | None = None if log_level == "error" else tmp / log_name
        self.args += ["--heartbeat-timeout-ms", "3000", *(extra_args or [])]
        if config is not None:
            (tmp / "router.json").write_text(json.dumps(config))
            self.args += ["--config", str(tmp / "router.json")]
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        env = {**os.environ, "NITSUM_WORKER_SECRET": SECRET}
        out = None if self.log is None else self.log.open("ab")
        self.proc = subprocess.Popen(self.args, env=env, stdout=out, stderr=out)
        wait(lambda: self.health() is not None, what="router HTTP up")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(5)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def health(self) -> dict[str, Any] | None:
        try:
            return httpx.get(f"{self.http}/health", timeout=2).json()
        except (httpx.HTTPError, ValueError):
            return None

    def workers(self) -> int:
        return (self.health() or {}).get("workers", -1)

    def generate(self, ids: list[int], n: int, timeout: float = 10.0) -> list[int]:
        """Output ids of a `/generate` call (strict tier)."""
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": n}}
        r = httpx.post(f"{self.http}/generate", json=body, timeout=timeout)
        assert r.status_code == 200, r.text
        return r.json()["output_ids"]

    def rejected(self, reason: str) -> int:
        """`nitsum_worker_plane_rejected_total{reason}` (0 when the metric is absent)."""
        text = httpx.get(f"{self.http}/metrics", timeout=2).text
        key = f'nitsum_worker_plane_rejected_total{{reason="{reason}"}} '
        return next(
            (int(line.split()[-1]) for line in text.splitlines() if line.startswith(key)), 0
        )


class RealWorker:
    """A `WorkerServer` thread (the real worker protocol code) over an `EchoBackend`, dialing
    `router` (a `Router`, or addresses: several routers, or a fake one); with `registered`,
    once it has registered."""

    def __init__(
        self,
        router: Router | str | list[str],
        worker_id: int = 0,
        delay: float = 0.0,
        heartbeat_every_s: float = 0.1,
        register_every_s: float = 5.0,
        registered: bool = True,
    ) -> None:
        self.backend = EchoBackend(worker_id, delay)
        addr = router.addr if isinstance(router, Router) else router
        self.server = WorkerServer(
            self.backend,
            addr,
            MODEL,
            register_every_s=register_every_s,
            heartbeat_every_s=heartbeat_every_s,
            secret=SECRET.encode(),
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        if registered:
            wait(lambda: self.server.registered, what="real worker registered")

    def stop(self) -> None:
        self.server.stop()
        self.thread.join(5)


class FakeRouter:
    """A ROUTER socket at the address a worker dials (a fake router); records what each peer
    sends. With `secret` it keeps the sealed channel a handshake it proves ends in (a sealed
    frame it cannot open reads as type "<sealed>")."""

    def __init__(self, addr: str | None = None, secret: bytes | None = None) -> None:
        self.addr = addr or f"tcp://127.0.0.1:{free_port()}"
        self.sock = zmq.Context.instance().socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(self.addr)
        self.got: list[dict] = []
        self.ends = RouterEnds(secret)

    def recv(self, timeout: float = 2.0) -> tuple[bytes, dict] | None:
        if not self.sock.poll(int(timeout * 1000)):
            return None
        peer, frame = self.sock.recv_multipart()
        msg = self.ends.read(peer, frame)
        self.got.append(msg)
        return peer, msg

    def send(self, peer: bytes, **msg: object) -> None:
        self.sock.send_multipart([peer, self.ends.frame(peer, {"v": 1, **msg})])

    def close(self) -> None:
        self.sock.close(linger=0)


class Peer:
    """An attacker's DEALER socket on the worker endpoint."""

    def __init__(self, addr: str, identity: bytes | None = None) -> None:
        # NOTE: the shared context: a peer left open by a failed test must not block a
        # context's term() (and so the test run) forever.
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        if identity is not None:
            self.sock.setsockopt(zmq.IDENTITY, identity)
        self.sock.connect(addr)
        self.end = WorkerEnd()  # its channel, when it registered with the secret

    def send(self, **msg: Any) -> None:
        self.sock.send(self.end.frame({"v": 1, **msg}))

    def recv(self, timeout: float = 2.0) -> dict[str, Any] | None:
        if not self.sock.poll(int(timeout * 1000)):
            return None
        return self.end.read(self.sock.recv())

    def register(self, worker_id: int, model: str = MODEL, secret: str | None = None) -> str:
        """Try to register (`hello`, then `register`); answers the challenge with `secret`
        (else a made-up proof). Returns the router's last answer type: "registered",
        "refused" or "silence"."""
        reg = {"type": "register", "worker_id": worker_id, "device": "cpu", "model": model}
        reg |= {"tp_levels": [1], "kv_capacity_tokens": 4096, "max_context": 256}
        nonce = new_nonce()
        self.end.channel = None
        hello = {"v": 1, "type": "hello", "worker_id": worker_id, "handshake": 3, "nonce": nonce}
        self.sock.send(self.end.hello(hello))
        while self.sock.poll(2000):
            frame = self.sock.recv()
            msg = self.end.read(frame)
            if msg["type"] == "challenge":
                key = (secret or "not-the-secret-at-all").encode()
                auth = worker_proof(key, nonce, msg["nonce"], worker_id, model)
                reg |= {"v": 1, "eos_token_ids": [EOS], "auth": auth}
                self.sock.send(self.end.register(key, nonce, frame, reg))
            elif msg["type"] in ("registered", "refused"):
                if msg["type"] == "refused":
                    self.end.channel = None  # the router started none
                self.last = msg
                return msg["type"]
        return "silence"

    def close(self) -> None:
        self.sock.close(linger=0)
