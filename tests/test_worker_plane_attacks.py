"""Worker-plane attack suite (issue 11, docs/security.md): a local process on the router's
worker endpoint tries to take over a worker id, join the pool, inject tokens into another
user's request, or break the router with garbage. After every attack a normal request must
answer exactly and the real worker must still be the one serving.

Runs the real `nitsum-router` binary (skipped when it is not built, like
test_router_protocol.py) and the real `WorkerServer` over an echo backend, on loopback.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest

from plane import SECRET, Peer, RealWorker, Router, bounded_run, wait
from test_router_protocol import BIN

# Spawns processes (devices, workers, router): out of the fast lane (scripts/test.sh --fast).
pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not BIN.exists(), reason=f"{BIN} not built")]

PROMPT = [104, 105, 106]
ECHO = [104, 105, 106, 104, 105, 106]


@pytest.fixture(autouse=True)
def bounded() -> Iterator[None]:
    """Every test is bounded (plane.bounded_run)."""
    with bounded_run(60):
        yield


@pytest.fixture()
def plane(tmp_path: Path) -> Iterator[tuple[Router, RealWorker]]:
    router = Router(tmp_path)
    worker = RealWorker(router, delay=0.02)
    try:
        yield router, worker
    finally:
        worker.stop()
        router.stop()


def assert_serving(router: Router, worker: RealWorker) -> None:
    """A normal request answers exactly, from the real worker, which is the only one."""
    served = len(worker.backend.seen_ids)
    assert router.generate(PROMPT, len(ECHO)) == ECHO
    assert len(worker.backend.seen_ids) == served + 1, "not served by the real worker"
    assert router.workers() == 1 and worker.server.registered and router.alive()


def slow_request(router: Router, out: list) -> threading.Thread:
    """A request that streams for ~0.5 s on the real worker; its output lands in `out`."""
    t = threading.Thread(target=lambda: out.append(router.generate(PROMPT, 24)), daemon=True)
    t.start()
    return t


def test_impostor_register_with_a_live_id_is_refused(plane: tuple[Router, RealWorker]) -> None:
    router, worker = plane
    out: list[list[int]] = []
    inflight = slow_request(router, out)
    wait(lambda: worker.backend.reqs, what="request running on worker 0")
    # Without the secret, with the old identity convention (b"0") and with a random one.
    for identity in (b"0", None):
        impostor = Peer(router.addr, identity)
        assert impostor.register(0) == "refused"
        impostor.close()
    # With the secret (a compromised worker): still refused, the id is held by a live worker.
    insider = Peer(router.addr)
    assert insider.register(0, secret=SECRET) == "refused"
    assert "another live connection" in insider.last["error"]
    insider.close()
    inflight.join(10)
    assert out == [(PROMPT * 8)], "the in-flight request on worker 0 was hurt"
    assert router.rejected("bad_proof") >= 2 and router.rejected("id_taken") >= 1
    assert_serving(router, worker)


def test_unknown_id_without_the_secret_never_joins(plane: tuple[Router, RealWorker]) -> None:
    router, worker = plane
    peer = Peer(router.addr)
    assert peer.register(7, model="other-model") == "refused"
    assert peer.register(7) == "refused"
    # A proof computed for another nonce (replay) or with no challenge at all.
    peer.send(type="register", worker_id=7, model="tiny", auth="ab" * 32)
    assert (peer.recv() or {}).get("type") == "refused"
    # Nothing else it says is heard: heartbeats, stats, acks, tokens.
    for ty in ("heartbeat", "stats", "reconfigured", "tokens"):
        peer.send(type=ty, worker_id=7, epoch=1, ok=True, request_id="1", token_ids=[1])
    wait(lambda: router.rejected("unauthenticated") >= 4, what="unauthenticated drops counted")
    assert router.workers() == 1
    peer.close()
    assert_serving(router, worker)


def test_register_for_another_model_is_refused(plane: tuple[Router, RealWorker]) -> None:
    router, worker = plane
    peer = Peer(router.addr)
    assert peer.register(3, model="another-model", secret=SECRET) == "refused"
    assert 'not "another-model"' in peer.last["error"]
    assert router.rejected("wrong_model") == 1
    peer.close()
    assert_serving(router, worker)


def test_cross_request_token_injection_is_dropped(tmp_path: Path) -> None:
    # Worker 1 only serves `relaxed`, so the strict request below runs on worker 0.
    groups = [{"members": [0]}, {"members": [1], "tiers": ["relaxed"], "accepts_background": False}]
    router = Router(tmp_path, {"plan": groups})
    worker = RealWorker(router, delay=0.02)
    evil = Peer(router.addr)
    try:
        assert evil.register(1, secret=SECRET) == "registered"  # authenticated, another id
        wait(lambda: router.workers() == 2, what="both workers registered")
        out: list[list[int]] = []
        inflight = slow_request(router, out)
        wait(lambda: worker.backend.reqs, what="request running on worker 0")
        rid = next(iter(worker.backend.reqs))
        assert len(rid) == 32 and int(rid, 16) > 0 and rid not in ("1", "2")
        forged = {"token_ids": [33, 33], "finish_reason": "stop", "error": None}
        for claimed in (1, 0):  # as itself, and naming the serving worker
            for guess in (rid, "1", "2", "3", "0000000000000001"):
                evil.send(type="tokens", worker_id=claimed, request_id=guess, **forged)
        inflight.join(10)
        assert out == [PROMPT * 8], "another worker wrote into the user's stream"
        assert router.rejected("foreign_request") >= 1
        assert router.rejected("wrong_worker") >= 1
        assert router.rejected("unknown_request") >= 1
        served = len(worker.backend.seen_ids)
        assert router.generate(PROMPT, len(ECHO)) == ECHO
        assert len(worker.backend.seen_ids) == served + 1
    finally:
        evil.close()
        worker.stop()
        router.stop()


def zmtp_handshake() -> bytes:
    """A ZMTP 3.0 NULL greeting and READY command of a DEALER peer."""
    greeting = b"\xff" + bytes(8) + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\0")
    greeting += b"\0" + bytes(31)
    body = b"\x05READY\x0bSocket-Type" + struct.pack(">I", 6) + b"DEALER"
    return greeting + b"\x04" + bytes([len(body)]) + body


def test_garbage_frames_do_not_hurt(plane: tuple[Router, RealWorker]) -> None:
    router, worker = plane
    peer = Peer(router.addr)
    register = msgpack.packb({"v": 1, "type": "register", "worker_id": 0, "model": "tiny"})
    frames = [os.urandom(n) for n in (1, 7, 100, 4096)]
    frames += [register[:-3], register[:5], b"", msgpack.packb([1, "register", 0])]
    frames += [msgpack.packb({"v": 2, "type": "register", "worker_id": 0})]
    frames += [msgpack.packb({"v": 1, "type": 5}), msgpack.packb({"v": 1})]
    frames += [b"\xdd\xff\xff\xff\xff", b"\xc6\x7f\xff\xff\xff"]  # huge array / bin headers
    frames += [os.urandom(32 << 20)]  # 32 MiB: under the transport's frame cap
    for f in frames:
        peer.sock.send(f)
    peer.sock.send_multipart([b"a", b"b", register])
    for raw in (os.urandom(256), zmtp_handshake() + b"\x02" + struct.pack(">Q", 1 << 40)):
        host, port = router.addr.removeprefix("tcp://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=2) as s:
            s.sendall(raw)  # no greeting at all; a frame header announcing 1 TiB
            s.settimeout(1.0)
            try:
                while s.recv(4096):
                    pass
            except (TimeoutError, ConnectionError):
                pass
    wait(lambda: router.rejected("undecodable") >= 5, what="garbage counted")
    peer.close()
    assert_serving(router, worker)


def rss_kib(pid: int) -> int:
    """VmRSS of process `pid` in KiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(x for x in status.splitlines() if x.startswith("VmRSS:")).split()[1])


def test_endless_message_of_empty_frames_is_cut_off(plane: tuple[Router, RealWorker]) -> None:
    # Issue 29.1: after the greeting, `\x01\x00` forever (one multipart message of empty
    # frames). The codec counted payload bytes only, so this grew the router ~17 bytes of
    # memory per byte sent until the peer left. Now the message's frame cap ends it.
    router, worker = plane
    assert router.proc is not None
    before = rss_kib(router.proc.pid)
    host, port = router.addr.removeprefix("tcp://").rsplit(":", 1)
    chunk, sent, limit = b"\x01\x00" * (1 << 15), 0, 16 << 20  # 64 KiB writes, 16 MiB at most
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(zmtp_handshake())
        try:
            while sent < limit:
                s.sendall(chunk)
                sent += len(chunk)
        except OSError:  # reset or broken pipe: the router dropped the connection
            pass
        grown = rss_kib(router.proc.pid) - before
    assert sent < limit, f"the router read {sent} bytes of empty frames and kept the connection"
    assert grown < 32 << 10, f"the router grew by {grown} KiB"
    assert_serving(router, worker)


def test_failed_registers_are_counted_but_logged_sparingly(tmp_path: Path) -> None:
    # Issue 29.8: one WARN per refused register let a peer fill the log (5,000 wrote 775 KB
    # in 2 s). Now the first few are logged, the rest summed up; the metric counts them all.
    router = Router(tmp_path, log_level="warn")
    peer = Peer(router.addr)
    try:
        n = 1000
        for i in range(n):  # a proof with no live challenge: refused as bad_proof
            peer.send(type="register", worker_id=i % 4, model="tiny", auth="ab" * 32)
        wait(lambda: router.rejected("bad_proof") == n, what=f"{n} refusals counted")
        assert router.log is not None
        lines = router.log.read_text().splitlines()
        one_by_one = [x for x in lines if "refused a worker register" in x]
        assert 1 <= len(one_by_one) <= 5, one_by_one[:10]
        assert len(lines) <= 10, lines[:20]
        # The rest in one summary line once the 10 s window is over (even with no new refusal).
        want = f"{n - len(one_by_one)} more failed registers in the last"
        wait(lambda: want in router.log.read_text(), timeout=15, what="the summary line")
        [summary] = [x for x in router.log.read_text().splitlines() if want in x]
        assert (
            f"bad_proof: {n - len(one_by_one)}" in summary
            and "for worker ids [0, 1, 2, 3]" in summary
        )
    finally:
        peer.close()
        router.stop()


def test_worker_reauthenticates_after_router_restart_and_ids_change(
    plane: tuple[Router, RealWorker],
) -> None:
    router, worker = plane
    assert_serving(router, worker)
    before = set(worker.backend.seen_ids)
    router.stop()
    router.start()  # same ports, a new process: new nonces, new request-id key
    wait(lambda: router.workers() == 1, timeout=15, what="worker re-registered")
    assert_serving(router, worker)
    after = set(worker.backend.seen_ids) - before
    assert after and not after & before
    assert all(len(r) == 32 for r in before | after)
