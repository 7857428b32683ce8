"""Binding decisions on the `stats` wire: the typed `last_bind` (worker/bind_decision.py) round
trips a real decision of the cost model (`nitsum._core.BindingModel`, scheduler-rs binding/),
and the worker sends the pool's latest one with its counters."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from nitsum import _core
from nitsum.codec import ProtocolError
from nitsum.worker import protocol as proto
from nitsum.worker.bind_decision import BindDecision, BindOption
from nitsum.worker.stats import Stats
from plane import EchoBackend, RealWorker, Router, wait
from test_router_protocol import BIN
from test_worker_server import registered, tiny, worker  # noqa: F401 (fixtures)

PROFILE = Path(__file__).resolve().parent.parent / "profiles" / "h100-llama3-8b-analytic.json"


def decide(prompt_tokens: int, decoding: int, ttft_ms: float) -> _core.BindDecision:
    """The cost model's answer for a TP-4 binding over four TP-1 replicas."""
    query = _core.BindQuery(
        level=4,
        prompt_tokens=prompt_tokens,
        output_tokens=128,
        ttft_ms=ttft_ms,
        tpot_ms=50.0,
        replicas=[_core.ReplicaLoad(tp=1, decoding=decoding, context=1024.0)] * 4,
        token_budget=2048,
        replica_output_tokens=256.0,
    )
    return _core.BindingModel(_core.Profile(PROFILE.read_text())).decide(query)


def wire(decision: _core.BindDecision) -> dict[str, Any]:
    """The decision as the worker sends it (`last_bind`)."""
    return BindDecision.from_core(decision).to_wire()


@pytest.fixture(scope="module")
def idle_block() -> _core.BindDecision:
    """An idle block and a long prompt with a tight TTFT: it binds in full."""
    return decide(4096, 0, 100.0)


def test_a_cost_model_decision_is_typed_and_round_trips_the_stats_wire(idle_block):
    decision = BindDecision.from_core(idle_block)
    raw = decision.to_wire()
    assert (decision.mode, decision.level, decision.replica) == ("full", 4, 0)
    assert [o.mode for o in decision.options] == ["dp", "prefill", "full"]
    assert all(isinstance(o, BindOption) for o in decision.options)
    assert decision.gain == idle_block.gain > 0.01
    # The wire map is the model's decision, key for key and value for value.
    assert raw["options"][2] == {
        k: getattr(idle_block.options[2], k)
        for k in ("mode", "ttft_ms", "tpot_ms", "meets", "lost_tokens", "value")
    }
    assert BindDecision.from_dict(raw) == decision
    msg = Stats.of(2, {"tp_binds": 1, "bind_decisions_full": 1}, decision)
    wire = proto.decode(proto.encode(msg.to_wire()))
    assert wire["last_bind"] == raw and wire["bind_decisions_full"] == 1
    assert Stats.from_wire(wire) == msg


def test_a_busy_block_decides_dp_and_a_stats_message_without_one_has_no_key():
    busy = BindDecision.from_core(decide(512, 64, 10_000.0))  # a loose TTFT: DP meets it
    assert busy.mode == "dp" and busy.gain == 0.0
    wire = Stats.of(2, {"bind_decisions_dp": 3}).to_wire()
    assert "last_bind" not in wire
    assert Stats.from_wire(wire).last_bind is None


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"mode": "sideways"}, "last_bind.mode"),
        ({"level": "4"}, "last_bind.level"),
        ({"options": [{"mode": "dp"}]}, "last_bind.options[0].ttft_ms"),
    ],
)
def test_a_malformed_decision_is_refused_naming_its_field(idle_block, change, field):
    raw = wire(idle_block) | change
    with pytest.raises(ProtocolError, match="^" + re.escape(field)):
        BindDecision.from_dict(raw)
    with pytest.raises(ProtocolError, match=re.escape(field)):
        Stats.from_wire({"v": 1, "type": "stats", "worker_id": 0, "last_bind": raw})


def test_a_counter_without_a_field_is_still_refused():
    with pytest.raises(ValueError, match="bind_decisions_maybe"):
        Stats.of(0, {"bind_decisions_maybe": 1})


def next_stats(router: Any, want: Any) -> dict[str, Any]:
    """The first `stats` message with `last_bind == want` (a stale one may come first)."""
    for _ in range(10):
        msg = router.expect("stats", timeout=5.0)
        if msg.get("last_bind") == want:
            return msg
    raise AssertionError(f"no stats with last_bind {want}: {router.seen[-3:]}")


def test_the_worker_sends_the_pools_latest_decision(worker, idle_block):  # noqa: F811
    router, server, _ = registered(worker)
    pe = server.backend.pe
    # NOTE: the pool keeps its cost model's latest decision as `decide` returned it (typed).
    pe.binder.chooser.last = idle_block
    first = next_stats(router, wire(idle_block))
    assert first["worker_id"] == 0
    dp = decide(512, 64, 10_000.0)
    pe.binder.chooser.last = dp
    assert next_stats(router, wire(dp))["last_bind"]["mode"] == "dp"


class BindingBackend(EchoBackend):
    """An echo backend whose pool reports binding counters and a cost-model decision."""

    COUNTERS = {"tp_binds": 2, "bind_decisions_dp": 5, "bind_decisions_full": 2}

    def __init__(self, decision: BindDecision) -> None:
        super().__init__()
        self.decision = decision

    def counters(self) -> dict[str, int]:
        return dict(self.COUNTERS)

    def last_bind(self) -> BindDecision | None:
        return self.decision


@pytest.mark.e2e
def test_the_real_router_shows_a_workers_decision_in_admin_plan_and_metrics(tmp_path, idle_block):
    if not BIN.exists():
        pytest.skip(f"{BIN} not built")
    router = Router(tmp_path)
    real = RealWorker(router)
    real.server.backend = BindingBackend(BindDecision.from_core(idle_block))
    try:

        def binding() -> Any:
            plan = httpx.get(f"{router.http}/admin/plan", timeout=2).json()
            return plan["workers"][0]["binding"]

        wait(lambda: binding() is not None, what="the worker's binding in /admin/plan")
        got = binding()
        assert got["counters"] == BindingBackend.COUNTERS
        want = wire(idle_block)
        assert got["last"]["mode"] == want["mode"] == "full"
        for option, expected in zip(got["last"]["options"], want["options"], strict=True):
            assert option.pop("mode") == expected.pop("mode")
            assert option == pytest.approx(expected, rel=1e-12)  # JSON's last digit may differ
        text = httpx.get(f"{router.http}/metrics", timeout=2).text
        samples = [ln for ln in text.splitlines() if ln.startswith("nitsum_bind_decisions_total")]
        assert samples == [
            'nitsum_bind_decisions_total{worker="0",mode="dp"} 5',
            'nitsum_bind_decisions_total{worker="0",mode="prefill"} 0',
            'nitsum_bind_decisions_total{worker="0",mode="full"} 2',
        ]
    finally:
        real.stop()
        router.stop()
