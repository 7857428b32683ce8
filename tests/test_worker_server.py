"""WorkerServer against a fake router (a ZMQ ROUTER socket in the test) on a tiny random model."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Any

import pytest
import torch
import zmq

from nitsum.engine.engine_config import EngineConfig
from nitsum.engine.request_spec import RequestSpec
from nitsum.pool.local import local_engine
from nitsum.sampling import SamplingParams
from nitsum.worker import protocol as proto
from nitsum.worker.assignment import Assignment
from nitsum.worker.backend import PoolBackend
from nitsum.worker.server import WorkerServer
from shapes import tp
from tiny import make_tiny

TIMEOUT_S = 10.0
GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


class FakeRouter:
    """The router's side of the socket; keeps every message it received, in order."""

    def __init__(self, addr: str = "tcp://127.0.0.1:*") -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(addr)
        self.addr = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.seen: list[tuple[float, dict[str, Any]]] = []
        # Worker id (as bytes) -> the ZMQ identity its socket uses: workers pick random ones.
        self.identities: dict[bytes, bytes] = {}

    def send(self, msg: proto.Message | dict[str, Any], identity: bytes = b"0") -> None:
        """Send to worker id `identity` (e.g. b"0"), at the identity its socket has; a dict
        goes out as it is (a `generate`, or a malformed message)."""
        raw = msg.to_wire() if isinstance(msg, proto.Message) else msg
        self.sock.send_multipart([self.identities.get(identity, identity), proto.encode(raw)])

    def _recv(self, deadline: float) -> dict[str, Any]:
        left_ms = int((deadline - time.monotonic()) * 1000)
        if left_ms <= 0 or not self.sock.poll(left_ms):
            raise TimeoutError("no message from the worker in time")
        identity, frame = self.sock.recv_multipart()
        msg = proto.decode(frame)
        self.learn(identity, msg)
        self.seen.append((time.monotonic(), msg))
        return msg

    def learn(self, identity: bytes, msg: dict[str, Any]) -> None:
        """Remember the identity of `msg`'s worker; one worker id keeps one identity."""
        wid = str(msg.get("worker_id")).encode()
        assert identity.startswith(b"w" + wid + b"-"), identity
        assert self.identities.setdefault(wid, identity) == identity, "identity changed"

    def expect(self, type_: str, timeout: float = TIMEOUT_S, **match: Any) -> dict[str, Any]:
        """The next message of `type_` whose fields equal `match` (others are kept in `seen`)."""
        deadline = time.monotonic() + timeout
        while True:
            msg = self._recv(deadline)
            if msg["type"] == type_ and all(msg.get(k) == v for k, v in match.items()):
                return msg

    def collect(self, rids: set[str], timeout: float = TIMEOUT_S) -> dict[str, list[dict]]:
        """Every `tokens` message of `rids` until each has had its final one."""
        out: dict[str, list[dict]] = {r: [] for r in rids}
        deadline = time.monotonic() + timeout
        while not all(m and m[-1]["finish_reason"] for m in out.values()):
            msg = self._recv(deadline)
            if msg["type"] == "tokens" and msg["request_id"] in out:
                out[msg["request_id"]].append(msg)
        return out

    def close(self) -> None:
        self.sock.close()
        self.ctx.term()


@pytest.fixture(scope="module")
def tiny():
    return make_tiny("llama-gqa")


def make_engine(tiny, **kw):
    hf, cfg = tiny
    ecfg = EngineConfig(kv_cache_bytes=1 << 20, page_tokens=4, **kw)
    return local_engine(cfg, hf.state_dict().items(), ecfg)


def engine_of(server):
    """The worker's one group engine (its device is a pool of one)."""
    return server.backend.pe.engines[tp(0)]


def solo(tiny, ids, params=GREEDY):
    engine = make_engine(tiny)
    engine.add_request("solo", ids, RequestSpec(params))
    out = []
    while engine.has_unfinished():
        for o in engine.step():
            out.extend(o.new_token_ids)
    return out


def prompt(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 128, (n,), generator=g).tolist()


@pytest.fixture
def worker(tiny):
    """Start a worker thread against a fake router; yields (router, server, thread)."""
    started = []

    def start(**kw):
        router = FakeRouter()
        backend = PoolBackend(make_engine(tiny), 0)
        server = WorkerServer(backend, router.addr, "tiny", heartbeat_every_s=0.2, **kw)
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        started.append((router, server, thread))
        return router, server, thread

    yield start
    for router, server, thread in started:
        server.stop()
        thread.join(TIMEOUT_S)
        router.close()
        assert not thread.is_alive(), "worker thread did not stop"


def registered(start, **kw):
    router, server, thread = start(**kw)
    router.expect("register")
    router.send(proto.Registered(0, epoch=1))
    router.expect("heartbeat", epoch=1)
    return router, server, thread


def test_register_is_resent_until_registered(worker, tiny):
    router, server, _ = worker(register_every_s=0.2)
    first = router.expect("register")
    pool = engine_of(server).pages
    assert first["worker_id"] == 0 and first["model"] == "tiny" and first["device"] == "cpu"
    assert first["tp_levels"] == [1]
    assert first["kv_capacity_tokens"] == pool.num_pages * 4
    assert first["max_context"] == 256
    assert first["eos_token_ids"] == sorted(tiny[1].eos_token_ids)
    router.expect("register", timeout=1.0)  # no answer yet: it comes again
    router.send(proto.Registered(0, epoch=7))
    router.expect("heartbeat", epoch=7)
    n = sum(m["type"] == "register" for _, m in router.seen)
    deadline = time.monotonic() + 0.8
    while time.monotonic() < deadline:
        router.expect("heartbeat", timeout=1.0)
    assert sum(m["type"] == "register" for _, m in router.seen) == n


def test_heartbeats_are_periodic_and_report_the_pool(worker):
    router, server, _ = registered(worker)
    beats = [router.expect("heartbeat") for _ in range(4)]
    times = [t for t, m in router.seen if m["type"] == "heartbeat"][-4:]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert all(0.1 < g < 1.0 for g in gaps), gaps
    pool = engine_of(server).pages
    for b in beats:
        assert (b["running"], b["waiting"], b["free_pages"]) == (0, 0, pool.num_pages)


def test_two_generates_stream_the_solo_greedy_tokens(worker, tiny):
    router, server, _ = registered(worker)
    a, b = prompt(9, seed=1), prompt(21, seed=2)
    router.send(proto.generate("a", a, GREEDY, tier="gold"))
    router.send(
        proto.generate("b", b, SamplingParams(max_tokens=5, temperature=0, ignore_eos=True))
    )
    got = router.collect({"a", "b"})
    assert [t for m in got["a"] for t in m["token_ids"]] == solo(tiny, a)
    assert [t for m in got["b"] for t in m["token_ids"]] == solo(
        tiny, b, SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
    )
    for rid, ids in (("a", a), ("b", b)):
        msgs = got[rid]
        assert [m["finish_reason"] for m in msgs] == [None] * (len(msgs) - 1) + ["length"]
        assert all(m["prompt_tokens"] == len(ids) and m["error"] is None for m in msgs)
        assert all(m["token_ids"] for m in msgs)  # no empty messages
    router.expect("heartbeat", free_pages=engine_of(server).pages.num_pages, running=0)


def test_abort_mid_generation_frees_pages(worker):
    router, server, _ = registered(worker)
    long = SamplingParams(max_tokens=200, temperature=0, ignore_eos=True)
    router.send(proto.generate("long", prompt(30), long))
    first = router.expect("tokens", request_id="long")
    assert first["finish_reason"] is None
    router.send(proto.Abort("long"))
    router.send(proto.Abort("never-seen"))  # unknown id: a no-op
    got = router.collect({"long"})["long"]
    assert got[-1]["finish_reason"] == "abort" and got[-1]["token_ids"] == []
    n = len([t for m in [first, *got] for t in m["token_ids"]])
    assert 1 <= n < 200
    pool = engine_of(server).pages
    router.expect("heartbeat", free_pages=pool.num_pages, running=0, waiting=0)
    assert not server.live and not server.backend.pe.has_unfinished()
    assert not [m for _, m in router.seen if m.get("request_id") == "never-seen"]
    assert sum(m.get("finish_reason") is not None for _, m in router.seen) == 1


def test_bad_requests_fail_alone_naming_the_field(worker, tiny):
    router, server, _ = registered(worker)
    good = prompt(12, seed=5)
    router.send(proto.generate("good", good, GREEDY))
    # NOTE: value ranges (max_tokens >= 1, ...) are the router's to check; the worker refuses
    # what cannot run (an empty prompt) and a malformed message (the codec names the field).
    zero = proto.generate("zero", prompt(4), GREEDY)
    router.send({**zero, "stop": {**zero["stop"], "max_tokens": "0"}})
    router.send(proto.generate("empty", [], GREEDY))
    router.send(proto.generate("typed", [1, "x"], GREEDY))
    slo_class = proto.generate("slo_class", [1, 2], GREEDY)
    router.send({**slo_class, "contract": {**slo_class["contract"], "class": "vip"}})
    router.send({"v": 2, "type": "generate", "request_id": "v2"})  # refused, not answered
    router.send({"v": 1, "type": "gossip"})  # unknown type: logged and dropped
    got = router.collect({"good", "zero", "empty", "typed", "slo_class"})
    errors = {rid: got[rid][-1]["error"] for rid in ("zero", "empty", "typed", "slo_class")}
    assert errors["zero"] == "generate: stop.max_tokens must be an integer, got '0'"
    assert errors["empty"].startswith("prompt:")
    assert errors["typed"] == "generate: input_ids[1] must be an integer, got 'x'"
    assert errors["slo_class"].startswith("generate: contract.class must be one of")
    params = {rid: got[rid][-1].get("error_param") for rid in errors}
    assert params == {
        "zero": "stop.max_tokens",
        "empty": "prompt",
        "typed": "input_ids[1]",
        "slo_class": "contract.class",
    }
    for rid in errors:
        assert [(m["finish_reason"], m["token_ids"]) for m in got[rid]] == [("error", [])]
    assert [t for m in got["good"] for t in m["token_ids"]] == solo(tiny, good)
    assert got["good"][-1]["finish_reason"] == "length"
    assert not [m for _, m in router.seen if m.get("request_id") == "v2"]


def test_failing_step_fails_its_requests_and_the_worker_goes_on(worker, tiny):
    router, server, _ = registered(worker)
    runner = server.backend.pe.pool.runner  # the in-process device's
    real = runner.forward
    calls = {"n": 0}

    def flaky(inputs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("boom")
        return real(inputs)

    runner.forward = flaky
    router.send(proto.generate("x", prompt(6), GREEDY))
    got = router.collect({"x"})["x"]
    assert got[-1]["finish_reason"] == "error"
    assert got[-1]["error"] == "engine step failed: RuntimeError: boom"
    assert "error_param" not in got[-1]  # the server failed, not the request: a 500 upstream
    assert [t for m in got for t in m["token_ids"]] == solo(tiny, prompt(6))[:1]
    after = prompt(7, seed=9)
    router.send(proto.generate("y", after, GREEDY))
    got = router.collect({"y"})["y"]
    assert [t for m in got for t in m["token_ids"]] == solo(tiny, after)
    assert engine_of(server).scheduler.num_reclaimable() == engine_of(server).pages.num_pages


def test_reconfigure_keeps_tp1_and_refuses_tp2(worker):
    router, server, _ = registered(worker)
    group = proto.GroupPlan([0], 1, "decode", ["gold"])
    router.send(proto.Reconfigure(5, [replace(group, accepts_background=False, max_batch=3)]))
    ack = router.expect("reconfigured")
    assert (ack["epoch"], ack["ok"], ack["error"], ack["worker_id"]) == (5, True, None, 0)
    assert ack["timings_ms"]["total"] >= 0
    router.expect("heartbeat", epoch=5)
    assert engine_of(server).max_batch == 3
    assert server.assignment == Assignment("decode", ["gold"], False, 3)
    router.send(proto.Reconfigure(6, [proto.GroupPlan([0, 1], 2, "mixed")]))
    ack = router.expect("reconfigured")
    assert (ack["epoch"], ack["ok"]) == (6, False)
    assert "spans devices of another worker process" in ack["error"]
    assert "`nitsum worker --devices N`" in ack["error"]
    router.send(proto.Reconfigure(7, [replace(group, role="chef")]))  # type: ignore[arg-type]
    ack = router.expect("reconfigured")
    assert not ack["ok"] and "groups[0].role" in ack["error"]
    router.expect("heartbeat", epoch=5)
    assert server.assignment.role == "decode"
    other = replace(group, members=[1])  # left out of the plan: idle, nothing to switch
    router.send(proto.Reconfigure(8, [other]))
    ack = router.expect("reconfigured")
    assert (ack["epoch"], ack["ok"]) == (8, True)
    assert server.assignment == Assignment() and engine_of(server).max_batch == 64
    router.send(proto.Reconfigure(3, [group]))  # older than the active plan
    ack = router.expect("reconfigured")
    assert (ack["epoch"], ack["ok"]) == (3, False) and "older than the active epoch 8" in ack[
        "error"
    ]
    router.send(proto.Reconfigure(8, [group]))  # another copy of epoch 8: the same answer
    ack = router.expect("reconfigured")
    assert (ack["epoch"], ack["ok"]) == (8, True) and server.assignment == Assignment()


def test_shutdown_exits_and_ends_live_requests(worker):
    router, server, thread = registered(worker)
    router.send(
        proto.generate(
            "s", prompt(8), SamplingParams(max_tokens=10_000, temperature=0, ignore_eos=True)
        )
    )
    router.expect("tokens", request_id="s")
    router.send(proto.Shutdown())
    thread.join(TIMEOUT_S)
    assert not thread.is_alive()
    final = router.collect({"s"})["s"][-1]
    assert (final["finish_reason"], final["error"]) == ("error", "worker shut down")


def test_a_restarted_router_gets_a_new_register(worker):
    router, server, _ = registered(worker)  # register_every_s is 5 s: only a reconnect is quick
    assert [m["type"] for _, m in router.seen].count("register") == 1  # not one per connect
    addr = router.addr
    router.sock.close()  # the router "dies"; the fixture closes it again harmlessly
    deadline = time.monotonic() + TIMEOUT_S
    while server.registered and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not server.registered
    again = FakeRouter(addr)
    try:
        again.expect("register", timeout=3.0)
        again.send(proto.Registered(0, epoch=2))
        again.expect("heartbeat", epoch=2)
        assert server.registered
    finally:
        again.close()
