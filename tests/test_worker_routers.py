"""A worker with several routers (docs/protocol.md "Several routers"): the real `WorkerServer`
over the echo backend of tests/plane.py, two fake routers (ZMQ ROUTER sockets in the test)
that prove the worker secret. Each router's requests stream back on its own socket; a
follower's lagging `registered` never lowers the worker's epoch and an older plan is refused
whichever router sends it; a router whose connection drops loses only its own requests."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from nitsum.worker.handshake import new_nonce, router_proof
from nitsum.worker.server import WorkerServer
from plane import SECRET, EchoBackend, FakeRouter, RealWorker, wait

PROMPT = [11, 12, 13]
TERM2 = 2 << 32  # epochs of the leader of lease term 2 (docs/protocol.md)


class ProvenRouter(FakeRouter):
    """A fake router that answers the worker's handshake with the secret, talking to the one
    worker connection it last heard from."""

    def __init__(self) -> None:
        super().__init__(secret=SECRET.encode())
        self.peer = b""

    def to_worker(self, **msg: Any) -> None:
        self.send(self.peer, **msg)

    def recv_kind(self, kind: str, timeout: float = 5.0) -> dict[str, Any]:
        """The next message of `kind` (others are kept in `got`)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.recv(0.05)
            if got is not None:
                self.peer, msg = got
                if msg["type"] == kind:
                    return msg
        raise AssertionError(f"no {kind} within {timeout} s; got {[m['type'] for m in self.got]}")

    def admit(self, epoch: int) -> None:
        """Answer the worker's `hello` with a valid challenge, its `register` with
        `registered` under `epoch`."""
        hello = self.recv_kind("hello")
        nonce = new_nonce()
        proof = router_proof(SECRET.encode(), hello["nonce"], nonce, 0)
        self.to_worker(type="challenge", worker_id=0, handshake=3, nonce=nonce, proof=proof)
        self.recv_kind("register")
        self.to_worker(type="registered", worker_id=0, epoch=epoch)

    def generate(self, rid: str, n: int) -> None:
        msg = {"request_id": rid, "input_ids": PROMPT, "stop": {"max_tokens": n}}
        self.to_worker(type="generate", **msg)

    def plan(self, epoch: int) -> dict[str, Any]:
        """Send a one-group plan under `epoch`; its ack."""
        group = {"members": [0], "tp": 1, "role": "mixed", "tiers": [], "accepts_background": True}
        self.to_worker(type="reconfigure", epoch=epoch, groups=[group])
        return self.recv_kind("reconfigured")


@pytest.fixture
def two_routers() -> Iterator[tuple[ProvenRouter, ProvenRouter, WorkerServer, EchoBackend]]:
    leader, follower = ProvenRouter(), ProvenRouter()
    worker = RealWorker(
        [leader.addr, follower.addr], 0, 0.01, 0.05, register_every_s=0.2, registered=False
    )
    server, backend = worker.server, worker.backend
    try:
        leader.admit(TERM2 + 1)
        follower.admit(TERM2 + 1)
        wait(lambda: server.registered, what="registered with both routers")
        yield leader, follower, server, backend
    finally:
        worker.stop()
        leader.close()
        follower.close()


def tokens_of(router: ProvenRouter, rid: str, timeout: float = 5.0) -> list[int]:
    """Every token id `router` got for `rid` up to its final message."""
    ids: list[int] = []
    deadline = time.monotonic() + timeout
    while True:
        msg = router.recv_kind("tokens", max(0.1, deadline - time.monotonic()))
        assert msg["request_id"] == rid, f"{router.addr} got tokens of {msg['request_id']}"
        ids += msg["token_ids"]
        if msg["finish_reason"] is not None:
            return ids


def test_each_router_gets_its_own_tokens_and_only_the_leaders_newer_plan_counts(two_routers):
    leader, follower, server, backend = two_routers
    assert leader.plan(TERM2 + 5)["ok"] is True
    assert server.plan.epoch == TERM2 + 5
    # The follower asks the worker to register again and answers with the epoch it knows,
    # which lags the leader's: the worker keeps its own.
    follower.to_worker(type="reregister")
    follower.admit(TERM2 + 1)
    wait(lambda: server.registered, what="registered again")
    assert server.plan.epoch == TERM2 + 5
    # A plan of an earlier term (a deposed leader's), from either router, is refused.
    for router in (follower, leader):
        ack = router.plan((1 << 32) + 99)
        assert ack["ok"] is False and "older than the active epoch" in ack["error"], ack
    assert server.plan.epoch == TERM2 + 5
    # Each router's request streams back on its own socket.
    leader.generate("a" * 32, 4)
    follower.generate("b" * 32, 4)
    assert tokens_of(leader, "a" * 32) == [11, 12, 13, 11]
    assert tokens_of(follower, "b" * 32) == [11, 12, 13, 11]


def test_a_router_that_goes_away_loses_only_its_own_requests(two_routers):
    leader, follower, server, backend = two_routers
    leader.generate("a" * 32, 300)
    follower.generate("b" * 32, 300)
    wait(lambda: len(backend.reqs) == 2, what="both requests running")
    follower.close()  # the router dies: its connection drops
    wait(lambda: list(backend.reqs) == ["a" * 32], what="the follower's request aborted")
    assert list(server.live) == ["a" * 32]
    leader.recv_kind("tokens")  # the leader's stream goes on
