"""The KV transport between host worker processes (pool/peers.py), in real processes on
loopback: a handoff arrives intact after the peers sat idle longer than every timeout, and a
peer that dies mid-transfer costs the receiver one dropped handoff, not a hang.

NOTE: each rank runs in its own spawned process and ends with `os._exit`, as a worker does
(gloo cannot cancel the receivers' waits).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from typing import Any

import pytest
import torch

from nitsum.pool.peers import KVPeers
from nitsum.ports import free_port

# Spawns processes (devices, workers, router): out of the fast lane (scripts/test.sh --fast).
pytestmark = pytest.mark.e2e


def _rank(rank: int, port: int, q: Any, ready: Any, idle_s: float, stall_s: float) -> None:
    ready.wait(60)  # NOTE: both ranks imported torch: a 1 s rendezvous is then plenty
    peers = KVPeers(
        f"tcp://127.0.0.1:{port}",
        rank,
        2,
        [10 + rank],
        timeout_s=1.0,
        stall_s=stall_s,
        rendezvous_s=1.0,
    )
    time.sleep(idle_s)  # longer than every timeout of the group
    if rank == 0:
        q.put(("serves", peers.serves(11), peers.serves(10)))
        q.put(("sending", 0))
        kv = torch.arange(2 * 3 * 4, dtype=torch.float32).view(2, 3, 4) / 7
        peers.send(11, {"request_id": "a", "tokens": [1, 2, 3]}, kv)
        peers.send(11, {"request_id": "b"}, kv.to(torch.bfloat16))
        q.put(("sent", 0))
        time.sleep(3.0)
    else:
        deadline = time.monotonic() + 10 + stall_s
        got: list = []
        while time.monotonic() < deadline and len(got) < 2 and not peers.failures:
            got += peers.arrivals()
            time.sleep(0.05)
        q.put(("got", [(m["request_id"], m.get("tokens"), kv.dtype, kv.tolist()) for m, kv in got]))
        q.put(("failures", peers.failures, sorted(peers.lost)))
    time.sleep(0.2)  # let the queue's feeder thread flush
    os._exit(0)


def _run(idle_s: float, stall_s: float, kill: bool) -> dict[str, Any]:
    """Both ranks; with `kill`, the sender is killed 1 s into its first send."""
    ctx = mp.get_context("spawn")
    q, ready = ctx.Queue(), ctx.Barrier(2)
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, q, ready, idle_s, stall_s)) for r in (0, 1)]
    for p in procs:
        p.start()
    out: dict[str, Any] = {}
    if kill:
        while "sending" not in out:
            key, *value = q.get(timeout=60)
            out[key] = value
        time.sleep(1.0)  # header and metadata sent; the KV would follow after the stall
        procs[0].kill()
    for p in procs:
        p.join(30)
        assert p.exitcode is not None, "a rank hung"
    while not q.empty():
        key, *value = q.get()
        out[key] = value
    return out


def test_a_handoff_arrives_intact_after_the_peers_idled_past_every_timeout() -> None:
    out = _run(idle_s=2.5, stall_s=0.0, kill=False)
    assert out["serves"] == [True, False]
    kv = torch.arange(24, dtype=torch.float32).view(2, 3, 4) / 7
    ((a, b),) = out["got"]
    assert a == ("a", [1, 2, 3], torch.float32, kv.tolist())
    assert b == ("b", None, torch.bfloat16, kv.to(torch.bfloat16).tolist())
    assert out["failures"] == [0, []]


def test_a_sender_killed_mid_transfer_costs_one_dropped_handoff() -> None:
    # The sender stalls 20 s between metadata and KV; it is killed during the stall.
    out = _run(idle_s=0.5, stall_s=20.0, kill=True)
    assert out["got"] == [[]]
    assert out["failures"] == [1, [0]]
