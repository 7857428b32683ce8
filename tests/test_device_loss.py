"""A host worker whose device process dies (kill -9) against a fake router: the device leaves
at once (`device_lost`, within 2 s, its requests dropped without an error for the router to
resume), its mates in a TP group register again, and the device comes back alone (TP 1)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from nitsum.pool.device_pool import DevicePool
from nitsum.pool.pool_engine import PoolEngine
from nitsum.worker import protocol as proto
from nitsum.worker.backend import PoolBackend
from nitsum.worker.device_watch import DeviceWatch
from nitsum.worker.server import WorkerServer
from nitsum.worker.supervise import Restarts
from shapes import tp
from test_host_worker import ECFG, NUM_PAGES, HostRouter, greedy, plan, prompt, reference
from tiny import make_tiny, tiny_device_pool

# Spawns device processes: out of the fast lane (scripts/test.sh --fast).
pytestmark = [pytest.mark.e2e, pytest.mark.slow]

N = 2
REPORT_S = 2.0  # a dead device is reported this fast (not after a heartbeat timeout)

Host = tuple[HostRouter, WorkerServer, PoolEngine, DevicePool]


@pytest.fixture(scope="module")
def tiny():
    return make_tiny("llama-gqa")


@pytest.fixture
def host(tiny) -> Iterator[Host]:
    """A registered 2-device host worker on its own pool (a test kills one of its devices)."""
    with tiny_device_pool(tiny, devices=N, levels=(1, 2)) as pool:
        pe = PoolEngine(pool, tiny[1], ECFG, NUM_PAGES, [tp(d) for d in range(N)])
        backend = PoolBackend(pe)
        backend.watch = DeviceWatch(pe, pool, 0, Restarts(base_s=0.2))
        router = HostRouter(N)
        server = WorkerServer(backend, router.addr, "tiny", heartbeat_every_s=0.2)
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        try:
            router.pump(lambda: len(_of(router, "register")) == N, timeout=10)
            for identity in router.ids:
                router.send(proto.Registered(int(identity), epoch=1), identity)
            router.pump(lambda: server.registered, timeout=10)
            yield router, server, pe, pool
        finally:
            server.stop()
            thread.join(60)
            router.close()
            assert not thread.is_alive(), "worker thread did not stop"


def _of(router: HostRouter, type_: str, since: float = 0.0) -> list[dict[str, Any]]:
    return [m for t, m in router.seen if m["type"] == type_ and t >= since]


def _kill(pool: DevicePool, device: int) -> float:
    os.kill(pool.procs[device].pid, signal.SIGKILL)  # type: ignore[arg-type]
    return time.monotonic()


def _arrival(router: HostRouter, msg: dict[str, Any]) -> float:
    return next(t for t, m in router.seen if m is msg)


def test_a_killed_device_leaves_at_once_and_comes_back_alone(host, tiny):
    router, server, pe, pool = host
    reqs = {
        f"on{d}_{i}": (prompt(6 + 5 * i + d, seed=10 * d + i), greedy(96))
        for d in range(N)
        for i in range(2)
    }
    ref = reference(tiny, reqs)
    for rid, (ids, params) in reqs.items():
        router.send(proto.generate(rid, ids, params), rid[2].encode())
    victims = [rid for rid in reqs if rid.startswith("on1")]
    router.pump(lambda: all(len(router.tokens.get(r, [])) >= 3 for r in victims))
    killed = _kill(pool, 1)

    router.pump(lambda: bool(_of(router, "device_lost")), timeout=10)
    lost = _of(router, "device_lost")[0]
    assert (lost["worker_id"], lost["reason"]) == (1, "device process exited with code -9")
    assert _arrival(router, lost) - killed < REPORT_S
    # The dead device's requests end without an answer: the router resumes them. What they
    # streamed is the greedy answer's start.
    streamed = {r: list(router.tokens[r]) for r in victims}
    for rid, got in streamed.items():
        assert rid not in router.finals, router.finals.get(rid)
        assert got == ref[rid][: len(got)], rid

    # Device 0's requests go on untouched.
    router.pump(lambda: all(r in router.finals for r in reqs if r.startswith("on0")))
    for rid in reqs:
        if rid.startswith("on0"):
            assert router.tokens[rid] == ref[rid]
            assert router.finals[rid]["finish_reason"] == "length"

    # Restarted, device 1 registers again: its own domain, TP 1 only (a world of its own).
    t_lost = _arrival(router, lost)
    router.pump(lambda: bool(_of(router, "register", since=t_lost)), timeout=60)
    again = _of(router, "register", since=t_lost)
    assert [(m["worker_id"], m["tp_levels"], m["domain"]) for m in again] == [(1, [1], 1)]
    # Silent while down: no heartbeat for a device the router must not count.
    t_back = _arrival(router, again[0])
    beats = [t for t, m in router.seen if m["type"] == "heartbeat" and m["worker_id"] == 1]
    assert not [t for t in beats if t_lost <= t < t_back]
    assert all(r not in router.finals for r in victims)  # still nothing from the old run
    router.send(proto.Registered(1, epoch=2), b"1")

    # The router resumes what died: each victim's prompt plus its streamed tokens, for the
    # rest of its tokens, one on the restarted device and one on device 0. Greedy: together
    # the exact uninterrupted answer.
    for rid, identity in zip(victims, (b"1", b"0"), strict=True):
        ids, params = reqs[rid]
        rest = greedy(params.max_tokens - len(streamed[rid]))
        router.send(proto.generate(f"{rid}+", ids + streamed[rid], rest), identity)
    router.pump(lambda: all(f"{r}+" in router.finals for r in victims))
    for rid in victims:
        assert streamed[rid] + router.tokens[f"{rid}+"] == ref[rid], rid
        assert router.came_on[f"{rid}+"] == {"1" if rid == victims[0] else "0"}

    # A plan that puts the restarted device in a TP group is refused, nothing changed.
    acks = router.reconfigure(3, plan([[0, 1]]))
    assert not acks["1"]["ok"] and "restarted alone" in acks["1"]["error"], acks
    assert [g.members for g in pe.groups] == [(0,), (1,)]
    for used, owned in pe.page_accounting().values():
        assert used == owned


def test_a_tp_group_losing_a_member_hands_its_requests_back(host, tiny):
    router, server, pe, pool = host
    acks = router.reconfigure(2, plan([[0, 1]]))
    assert all(a["ok"] for a in acks.values()), acks
    reqs = {f"r{i}": (prompt(7 + 3 * i, seed=i), greedy(96)) for i in range(3)}
    for rid, (ids, params) in reqs.items():
        router.send(proto.generate(rid, ids, params), b"0")  # the group's leader
    router.pump(lambda: all(len(router.tokens.get(r, [])) >= 2 for r in reqs))
    start = time.monotonic()
    _kill(pool, 1)

    # Device 1 is reported lost; device 0 lived on but lost its group, so it registers
    # again: the router's sign to resume what came on it (`reregister` semantics).
    router.pump(lambda: bool(_of(router, "device_lost")), timeout=10)
    router.pump(lambda: [m["worker_id"] for m in _of(router, "register", start)] == [0])
    assert [m["worker_id"] for m in _of(router, "device_lost")] == [1]
    assert not any(r in router.finals for r in reqs), "no error: the router resumes them"
    assert [g.members for g in pe.groups] == [(0,)]
    # Device 0 serves alone meanwhile, and the reference is what it computes.
    router.send(proto.Registered(0, epoch=3), b"0")
    ids, params = reqs["r0"]
    router.send(proto.generate("again", ids, params), b"0")
    router.pump(lambda: "again" in router.finals)
    assert router.tokens["again"] == reference(tiny, {"r0": reqs["r0"]})["r0"]
