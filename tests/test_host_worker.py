"""The host worker (WorkerServer over a PoolBackend) against a fake router: 4 CPU devices,
one socket per device, `reconfigure` switching TP mid-stream on a tiny random model."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from nitsum.engine.build import build_engine
from nitsum.engine.engine_config import EngineConfig
from nitsum.engine.request_spec import RequestSpec
from nitsum.parallel.topology import GroupShape
from nitsum.pool.pool_engine import PoolEngine
from nitsum.sampling import SamplingParams
from nitsum.worker import protocol as proto
from nitsum.worker.backend import PoolBackend
from nitsum.worker.server import WorkerServer
from shapes import tp
from test_worker_server import FakeRouter
from tiny import POOL_DEVICES, POOL_ECFG, POOL_PAGES, make_tiny, tiny_device_pool

# Spawns processes (devices, workers, router): out of the fast lane (scripts/test.sh --fast).
pytestmark = pytest.mark.e2e

N = POOL_DEVICES
ECFG, NUM_PAGES = POOL_ECFG, POOL_PAGES
TIMEOUT_S = 60.0

TP1, TP2, TP4 = [[0], [1], [2], [3]], [[0, 1], [2, 3]], [[0, 1, 2, 3]]


def plan(groups: list[list[int]], **extra: Any) -> list[dict[str, Any]]:
    return [
        {"members": g, "tp": len(g), "role": "mixed", "tiers": [], "accepts_background": True}
        | extra
        for g in groups
    ]


class HostRouter(FakeRouter):
    """A fake router that talks to several worker ids and sorts what it receives."""

    def __init__(self, n: int = N) -> None:
        super().__init__()
        self.ids = [str(d).encode() for d in range(n)]
        self.tokens: dict[str, list[int]] = {}
        self.finals: dict[str, dict[str, Any]] = {}
        self.came_on: dict[str, set[str]] = {}  # request id -> identities its tokens came on
        self.acks: dict[int, dict[str, dict[str, Any]]] = {}  # epoch -> identity -> ack

    def _recv(self, deadline: float) -> dict[str, Any]:
        left_ms = int((deadline - time.monotonic()) * 1000)
        if left_ms <= 0 or not self.sock.poll(left_ms):
            raise TimeoutError("no message from the worker in time")
        identity, frame = self.sock.recv_multipart()
        msg = proto.decode(frame)
        self.learn(identity, msg)  # each socket speaks for itself, under one identity
        msg["_from"] = str(msg["worker_id"])
        self.seen.append((time.monotonic(), msg))
        if msg["type"] == "tokens":
            rid = msg["request_id"]
            assert rid not in self.finals, f"{rid}: a message after its final one"
            self.tokens.setdefault(rid, []).extend(msg["token_ids"])
            self.came_on.setdefault(rid, set()).add(msg["_from"])
            if msg["finish_reason"] is not None:
                self.finals[rid] = msg
        elif msg["type"] == "reconfigured":
            self.acks.setdefault(msg["epoch"], {})[msg["_from"]] = msg
        return msg

    def pump(self, until: Callable[[], bool], timeout: float = TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while not until():
            self._recv(deadline)

    def reconfigure(self, epoch: int, groups: list[dict[str, Any]]) -> dict[str, dict]:
        """Send the plan to every device, as the router does; returns their acks."""
        for identity in self.ids:
            self.send(proto.Reconfigure(epoch, [proto.GroupPlan(**g) for g in groups]), identity)
        self.pump(lambda: len(self.acks.get(epoch, {})) == len(self.ids))
        return self.acks[epoch]


@pytest.fixture(scope="module")
def tiny():
    return make_tiny("llama-gqa")


@pytest.fixture(scope="module")
def pool(tiny):
    with tiny_device_pool(tiny) as p:
        yield p


@pytest.fixture
def host(pool, tiny):
    """A registered host worker thread on the shared pool; yields (router, server, engine)."""
    pe = PoolEngine(pool, tiny[1], ECFG, NUM_PAGES, [tp(d) for d in range(N)])
    router = HostRouter()
    server = WorkerServer(PoolBackend(pe), router.addr, "tiny", heartbeat_every_s=0.2)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:

        def regs() -> dict[str, dict[str, Any]]:
            return {m["_from"]: m for _, m in router.seen if m["type"] == "register"}

        router.pump(lambda: len(regs()) == N, timeout=10)
        for identity in router.ids:
            router.send(proto.Registered(int(identity), epoch=1), identity)
        router.pump(lambda: server.registered, timeout=10)
        yield router, server, pe, regs()
    finally:
        server.stop()
        thread.join(TIMEOUT_S)
        router.close()
        assert not thread.is_alive(), "worker thread did not stop"


def prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 128, (n,), generator=g).tolist()


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)


def reference(tiny, reqs: dict[str, tuple[list[int], SamplingParams]]) -> dict[str, list[int]]:
    hf, cfg = tiny
    engine = build_engine(cfg, hf.state_dict().items(), EngineConfig(page_tokens=4))
    for rid, (ids, params) in reqs.items():
        engine.add_request(rid, ids, RequestSpec(params))
    out: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for o in engine.step():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
    return out


def heartbeats_settle(router: HostRouter, **match: Any) -> None:
    """A heartbeat with `match` from every device, all sent after this call."""
    start, got = time.monotonic(), set()

    def done() -> bool:
        for t, m in router.seen:
            if t >= start and m["type"] == "heartbeat" and all(m[k] == v for k, v in match.items()):
                got.add(m["_from"])
        return len(got) == N

    router.pump(done, timeout=10)


def test_reconfigure_switches_tp_mid_stream_and_keeps_greedy_tokens(host, tiny):
    router, server, pe, regs = host
    assert sorted(regs) == ["0", "1", "2", "3"]
    for r in regs.values():
        assert r["tp_levels"] == [1, 2, 4] and r["kv_capacity_tokens"] == NUM_PAGES * 4
        assert r["domain"] == 0  # one process: one domain for all its devices
    reqs = {f"r{i}": (prompt(5 + 7 * i, seed=i), greedy(48 + 8 * i)) for i in range(8)}
    late = {"late1": (prompt(9, seed=20), greedy(12)), "late3": (prompt(13, seed=21), greedy(12))}
    ref = reference(tiny, reqs | late)
    sent_to = {rid: router.ids[i % N] for i, rid in enumerate(reqs)}  # two per leader
    for rid, (ids, params) in reqs.items():
        router.send(proto.generate(rid, ids, params, slo_class="feasible"), sent_to[rid])

    def streamed(k: int) -> Callable[[], bool]:
        return lambda: all(len(router.tokens.get(rid, [])) >= k for rid in reqs)

    timings = []
    for epoch, (layout, after) in enumerate(((TP2, 3), (TP4, 10), (TP1, 18)), start=2):
        router.pump(streamed(after))
        assert not any(rid in router.finals for rid in reqs), "switch after the end"
        acks = router.reconfigure(epoch, plan(layout))
        assert sorted(acks) == ["0", "1", "2", "3"]
        for ack in acks.values():
            assert (ack["ok"], ack["error"]) == (True, None), ack
        # Applied once: the copies on the other sockets are answered with the same report.
        assert len({tuple(sorted(a["timings_ms"].items())) for a in acks.values()}) == 1
        timings.append(acks["0"]["timings_ms"])
        assert pe.groups == [GroupShape.tp_group(tuple(g)) for g in layout]
        if layout == TP2:  # a non-leader's generate joins the group that holds the device
            for rid, identity in (("late1", b"1"), ("late3", b"3")):
                router.send(proto.generate(rid, *late[rid]), identity)
            sent_to |= {"late1": b"1", "late3": b"3"}
    router.pump(lambda: set(router.finals) == set(ref))
    assert router.tokens == ref
    for rid, identity in sent_to.items():
        assert router.came_on[rid] == {identity.decode()}, rid
        assert router.finals[rid]["finish_reason"] == "length"
    for t in timings:
        assert {"plan", "transfer", "commit_activate", "total"} <= set(t)
        assert all(v >= 0 for v in t.values())
    heartbeats_settle(router, free_pages=NUM_PAGES, running=0, waiting=0, epoch=4)
    assert not server.live and not pe.has_unfinished()
    for device, (used, owned) in pe.page_accounting().items():
        assert used == owned, device  # the pages left are the groups' prefix caches
    for engine in pe.engines.values():
        engine.close()
    for device, (used, owned) in pe.page_accounting().items():
        assert used == owned == set(), device


def test_prefill_group_hands_kv_to_the_decode_target_and_reports_it(host, tiny):
    router, server, pe, _ = host
    layout = plan([[0]], role="prefill") + plan([[1]]) + plan([[2, 3]], role="decode")
    assert all(a["ok"] for a in router.reconfigure(2, layout).values())
    reqs = {f"pd{i}": (prompt(6 + 5 * i, seed=40 + i), greedy(10)) for i in range(4)}
    ref = reference(tiny, reqs)
    for rid, (ids, params) in reqs.items():
        router.send(proto.generate(rid, ids, params, slo_class="feasible", decode_target=2), b"0")
    router.pump(lambda: set(router.finals) == set(reqs))
    assert router.tokens == ref
    for rid in reqs:  # one process serves both groups: it streams on the socket sent to
        assert router.came_on[rid] == {"0"}, rid

    def handoffs() -> dict[str, Any] | None:
        reports = [m for t, m in router.seen if m["type"] == "stats"]
        return reports[-1] if reports and reports[-1]["kv_handoffs"] == len(reqs) else None

    router.pump(lambda: handoffs() is not None, timeout=10)
    report = handoffs()
    assert report is not None and report["_from"] == "0"
    assert report["kv_handoff_bytes"] > 0 and report["reconfigurations"] == 1
    # A decode target in another process (worker 9) has no KV path: the prefill group decodes
    # the request itself, and nothing is handed off.
    far = {"far": (prompt(9, seed=50), greedy(6))}
    router.send(proto.generate("far", *far["far"], slo_class="feasible", decode_target=9), b"0")
    router.pump(lambda: "far" in router.finals)
    assert router.tokens["far"] == reference(tiny, far)["far"]
    assert pe.counters["kv_handoffs"] == len(reqs)
    heartbeats_settle(router, free_pages=NUM_PAGES, running=0, waiting=0, epoch=2)


def test_abort_reaches_a_request_that_moved_groups(host):
    router, server, pe, _ = host
    router.send(proto.generate("long", prompt(10, seed=3), greedy(10_000)), b"3")
    router.pump(lambda: len(router.tokens.get("long", [])) >= 2)
    assert router.reconfigure(2, plan(TP4))["3"]["ok"]
    router.pump(lambda: len(router.tokens["long"]) >= 4)
    router.send(proto.Abort("long"), b"3")
    router.pump(lambda: "long" in router.finals)
    final = router.finals["long"]
    assert (final["_from"], final["finish_reason"], final["token_ids"]) == ("3", "abort", [])
    heartbeats_settle(router, free_pages=NUM_PAGES, running=0, epoch=2)


@pytest.mark.parametrize(
    "groups, error",
    [
        ([[1, 2], [0], [3]], "not an aligned block"),
        ([[0, 1, 2], [3]], "TP 3 not in the allowed levels"),
        (plan([[0, 1]], tp=4), "tp 4 x pp 1 != its 2 members"),
        ([[2, 3], [3]], "more than one group"),
        ([[3, 4]], "spans devices of another worker process"),
    ],
)
def test_an_illegal_plan_is_refused_and_serving_goes_on(host, tiny, groups, error):
    router, server, pe, _ = host
    assert router.reconfigure(2, plan(TP2))["0"]["ok"]
    ids = prompt(11, seed=7)
    ref = reference(tiny, {"x": (ids, greedy(40))})
    router.send(proto.generate("x", ids, greedy(40)), b"2")
    router.pump(lambda: len(router.tokens.get("x", [])) >= 3)
    body = groups if isinstance(groups[0], dict) else plan(groups)
    acks = router.reconfigure(3, body)
    for ack in acks.values():
        assert not ack["ok"] and error in ack["error"], ack
    assert pe.groups == [tp(0, 1), tp(2, 3)]
    router.pump(lambda: "x" in router.finals)
    assert router.tokens == ref and router.came_on["x"] == {"2"}
    heartbeats_settle(router, free_pages=NUM_PAGES, running=0, epoch=2)


def test_nitsum_worker_devices_2_process_switches_tp_and_stops_its_devices(tiny, tmp_path):
    pytest.importorskip("nitsum.weights.hf")
    hf, _ = tiny
    hf.save_pretrained(tmp_path / "tiny", safe_serialization=True)
    router = HostRouter(2)
    cmd = [sys.executable, "-m", "nitsum.worker", "--model", str(tmp_path / "tiny")]
    cmd += ["--devices", "2", "--worker-id", "0", "--router", router.addr]
    cmd += ["--kv-cache-mb", "1", "--page-tokens", "4", "--log-level", "WARNING"]
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(cmd, env=env, cwd=root)
    try:
        router.pump(
            lambda: {m["_from"] for _, m in router.seen if m["type"] == "register"} == {"0", "1"},
            timeout=120,
        )
        regs = [m for _, m in router.seen if m["type"] == "register"]
        assert all(m["tp_levels"] == [1, 2] and m["model"] == "tiny" for m in regs)
        for identity in router.ids:
            router.send(proto.Registered(int(identity), epoch=1), identity)
        reqs = {"a": (prompt(9, seed=1), greedy(24)), "b": (prompt(14, seed=2), greedy(24))}
        ref = reference(tiny, reqs)
        for (rid, (ids, params)), identity in zip(reqs.items(), router.ids, strict=True):
            router.send(proto.generate(rid, ids, params), identity)
        router.pump(lambda: all(len(router.tokens.get(r, [])) >= 2 for r in reqs))
        assert not router.finals  # the switch moves running requests
        acks = router.reconfigure(2, plan([[0, 1]]))
        assert all(a["ok"] for a in acks.values()), acks
        router.pump(lambda: set(router.finals) == set(reqs))
        assert router.tokens == ref
        assert router.came_on == {"a": {"0"}, "b": {"1"}}
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        devices = [c for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]
        assert len(devices) == 2  # the device processes (not multiprocessing's resource tracker)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        deadline = time.monotonic() + 10
        while any(Path(f"/proc/{d}").exists() for d in devices) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(Path(f"/proc/{d}").exists() for d in devices), "device processes left"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        router.close()


def test_a_plan_with_a_pipeline_switches_to_it_mid_stream(host, tiny):
    """The router's plan names a (2, 2) pipeline (`pp`): the worker switches to it and back
    mid-stream, and every request's tokens are the reference's."""
    router, server, pe, _ = host
    reqs = {f"p{i}": (prompt(6 + 5 * i, seed=40 + i), greedy(30)) for i in range(4)}
    ref = reference(tiny, reqs)
    for i, (rid, (ids, params)) in enumerate(reqs.items()):
        router.send(proto.generate(rid, ids, params, slo_class="feasible"), router.ids[i])
    pipeline = [g | {"tp": 2, "pp": 2} for g in plan([[0, 1, 2, 3]])]
    for epoch, (layout, after) in enumerate(((pipeline, 4), (plan(TP1), 12)), start=2):
        router.pump(lambda k=after: all(len(router.tokens.get(r, [])) >= k for r in reqs))
        acks = router.reconfigure(epoch, layout)
        assert all((a["ok"], a["error"]) == (True, None) for a in acks.values()), acks
        expect = (2, 2) if layout is pipeline else (1, 1)
        assert all((g.tp, g.pp) == expect for g in pe.groups)
    router.pump(lambda: set(router.finals) >= set(reqs))
    assert {rid: router.tokens[rid] for rid in reqs} == ref
    assert pe.all_counters()["pp_steps"] > 0
