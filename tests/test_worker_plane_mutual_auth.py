"""The worker side of the worker-plane attack suite (issue 29.4, docs/security.md): a peer at
the address a worker dials — a fake router without the secret, or a relay that forwards the
real router's challenge — must get nothing from the worker: no `register`, no heartbeat, no
tokens, and no prompt served. The worker must keep running and retry.

Runs the real `WorkerServer` over the echo backend of tests/plane.py, the real `nitsum-router`
binary for the relay case (skipped when it is not built), and attacker sockets, on loopback.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest
import zmq

from nitsum.worker.handshake import new_nonce, router_proof
from nitsum.worker.server import WorkerServer
from plane import SECRET, EchoBackend, FakeRouter, RealWorker, Router, bounded_run, wait
from test_router_protocol import BIN

pytestmark = pytest.mark.e2e

PROMPT = [104, 105, 106]


@pytest.fixture(autouse=True)
def bounded() -> Iterator[None]:
    """Every test is bounded (plane.bounded_run)."""
    with bounded_run(60):
        yield


def start_worker(addr: str) -> tuple[WorkerServer, EchoBackend, threading.Thread]:
    """The real worker (with the secret) dialing `addr`; it says `hello` every 0.3 s."""
    worker = RealWorker(addr, heartbeat_every_s=0.05, register_every_s=0.3, registered=False)
    return worker.server, worker.backend, worker.thread


def lure(fake: FakeRouter, peer: bytes, worker_id: int = 0) -> None:
    """What an impostor sends besides its challenge: a prompt, an acceptance and a plan."""
    fake.send(peer, type="registered", worker_id=worker_id, epoch=1)
    fake.send(
        peer,
        type="generate",
        request_id="0123456789abcdef0123456789abcdef",
        input_ids=PROMPT,
        sampling={"max_tokens": 4},
        tier="",
        **{"class": "feasible"},
    )
    fake.send(peer, type="reconfigure", epoch=2, groups=[{"members": [0], "tp": 1}])


def test_a_fake_router_without_the_secret_gets_nothing(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeRouter()
    server, backend, thread = start_worker(fake.addr)
    try:
        first = fake.recv()
        assert first is not None, "the worker never spoke"
        peer, hello = first
        assert hello["type"] == "hello" and hello["handshake"] == 3
        assert set(hello) == {"v", "type", "worker_id", "handshake", "nonce"}
        # Proofs an impostor can make: under a guessed secret, none at all, and a replay of a
        # proof computed for another nonce.
        wrong = b"not-the-secret-at-all-0000"
        answers = [
            router_proof(wrong, hello["nonce"], "cd" * 32, 0),
            "",
            router_proof(SECRET.encode(), new_nonce(), "cd" * 32, 0),
        ]
        for proof in answers:
            fake.send(
                peer, type="challenge", worker_id=0, handshake=3, nonce="cd" * 32, proof=proof
            )
            lure(fake, peer)
            got = fake.recv()
            assert got is not None, "the worker stopped retrying"
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            fake.recv(0.1)
        kinds = {m["type"] for m in fake.got}
        assert kinds == {"hello"}, f"the worker sent {kinds - {'hello'}} to an impostor"
        assert backend.seen_ids == [], "the worker ran an impostor's prompt"
        assert not server.registered and thread.is_alive()
        assert "did not prove the worker secret" in caplog.text
    finally:
        server.stop()
        thread.join(5)
        fake.close()


@pytest.mark.skipif(not BIN.exists(), reason=f"{BIN} not built")
def test_a_relay_of_the_real_routers_challenge_gets_no_register(tmp_path: Path) -> None:
    # The attack of issue 29.4: the relay controls the address the worker dials, opens its own
    # handshake with the real router and hands the router's challenge to the real worker, to
    # get the worker's proof and register as it. The router's proof covers the relay's nonce,
    # not the worker's, so the worker refuses it and sends nothing.
    router = Router(tmp_path)
    fake = FakeRouter()
    upstream = zmq.Context.instance().socket(zmq.DEALER)
    upstream.setsockopt(zmq.LINGER, 0)
    upstream.connect(router.addr)
    server, backend, thread = start_worker(fake.addr)
    try:
        relayed = 0
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            got = fake.recv(0.2)
            if got is None or got[1]["type"] != "hello":
                continue
            peer, hello = got
            upstream.send(msgpack.packb({**hello, "nonce": new_nonce()}))  # its own nonce
            assert upstream.poll(2000), "the router did not answer the relay's hello"
            challenge = msgpack.unpackb(upstream.recv(), raw=False)
            assert challenge["type"] == "challenge" and len(challenge["proof"]) == 64
            fake.sock.send_multipart([peer, msgpack.packb(challenge)])
            lure(fake, peer)
            relayed += 1
        assert relayed >= 3, "the worker did not keep retrying"
        kinds = {m["type"] for m in fake.got}
        assert kinds == {"hello"}, f"the worker sent {kinds - {'hello'}} to the relay"
        assert backend.seen_ids == [] and not server.registered and thread.is_alive()
        assert router.workers() == 0 and router.rejected("bad_proof") == 0
    finally:
        server.stop()
        thread.join(5)
        upstream.close(linger=0)
        fake.close()
        router.stop()


@pytest.mark.skipif(not BIN.exists(), reason=f"{BIN} not built")
def test_the_real_router_is_proven_and_served(tmp_path: Path) -> None:
    router = Router(tmp_path)
    server, backend, thread = start_worker(router.addr)
    try:
        wait(lambda: server.registered, what="worker registered with the real router")
        assert router.generate(PROMPT, 6) == PROMPT * 2
        assert len(backend.seen_ids) == 1
        assert router.rejected("bad_proof") == 0 and router.rejected("handshake") == 0
    finally:
        server.stop()
        thread.join(5)
        router.stop()
