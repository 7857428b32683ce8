"""The binding cost model scaled by the steps measured here (pool/bind_choice.py `observe`):
a profile taken alone or on another machine says how options compare, the moving average of
measured / profiled step time per TP level says how fast they run here. No devices: the
steps are Scheduled items of real sequences, the times are given."""

from dataclasses import replace

from bind_helpers import ECFG, greedy, write_profile
from nitsum.engine.engine import Engine
from nitsum.engine.request_spec import RequestSpec
from nitsum.engine.scheduled import Scheduled
from nitsum.engine.sequence import Sequence
from nitsum.pool.bind_choice import SLOWDOWN_RANGE, Chooser
from shapes import tp

# Prefill 1 ms a token at TP 1 and 0.5 at TP 2; decode 10 / 10 ms (x (1 + batch / 10)).
SHAPE = ({1: 1.0, 2: 0.5}, {1: 10.0, 2: 10.0})


def chooser(tmp_path, calibrate: bool = True) -> Chooser:
    ecfg = replace(ECFG, binding_profile=write_profile(tmp_path / "p.json", *SHAPE))
    return Chooser(replace(ecfg, bind_calibrate=calibrate), (1, 2), {})


def prefill_step(tokens: int) -> list[Scheduled]:
    seq = Sequence("x", list(range(tokens)), RequestSpec(greedy(4)))
    return [Scheduled(seq, 0, tokens)]


def decode_step(batch: int, context: int) -> list[Scheduled]:
    items = []
    for i in range(batch):
        seq = Sequence(f"d{i}", list(range(context)), RequestSpec(greedy(4)))
        items.append(Scheduled(seq, context, 1))
    return items


def test_steps_twice_as_slow_as_profiled_make_a_slowdown_of_two(tmp_path) -> None:
    c = chooser(tmp_path)
    assert c.slowdown == {}
    for _ in range(30):
        c.observe(1, prefill_step(100), 200.0)  # profiled: 100 ms
        c.observe(1, decode_step(10, 50), 40.0)  # profiled: 10 x 2 = 20 ms
        c.observe(2, prefill_step(100), 50.0)  # profiled: 50 ms
    assert abs(c.slowdown[1] - 2.0) < 1e-6 and abs(c.slowdown[2] - 1.0) < 1e-6
    # One stalled step moves the average by at most its weight times the clamp.
    before = c.slowdown[1]
    c.observe(1, prefill_step(100), 1e6)
    assert c.slowdown[1] <= before + 0.1 * (SLOWDOWN_RANGE[1] - before) + 1e-9


def test_the_query_carries_each_level_s_slowdown(tmp_path) -> None:
    c = chooser(tmp_path)
    c.slowdown = {1: 3.0, 2: 1.5}
    q = c._query(2, {tp(0): _idle(), tp(1): _idle()}, RequestSpec(greedy(8), ttft_ms=100), 64, 8, 0)
    assert [r.slowdown for r in q.replicas] == [3.0, 3.0] and q.bound_slowdown == 1.5
    # And the model uses them: DP's first token three times as late as profiled.
    assert c.model is not None
    d = c.model.decide(q)
    dp = next(o for o in d.options if o.mode == "dp")
    assert abs(dp.ttft_ms - 3.0 * 64.0) < 1e-6, d


def test_calibration_off_keeps_the_profile(tmp_path) -> None:
    c = chooser(tmp_path, calibrate=False)
    c.observe(1, prefill_step(100), 500.0)
    assert c.slowdown == {}


class _Idle:
    """What `_query` reads of a replica's engine: nothing running or queued."""

    def sequences(self) -> list[Sequence]:
        return []

    def running(self) -> list[Sequence]:
        return []


def _idle() -> Engine:
    return _Idle()  # type: ignore[return-value]


def test_the_query_weighs_the_tier_s_tpot_target_and_weight(tmp_path) -> None:
    """The router sends each request's tier TPOT target and goodput weight (`generate`'s
    `tpot_ms`, `weight`): the cost model values the request with them."""
    c = chooser(tmp_path)
    spec = RequestSpec(greedy(8), ttft_ms=100, tpot_ms=15.0, weight=4.0)
    q = c._query(2, {tp(0): _idle(), tp(1): _idle()}, spec, 64, 8, 0)
    assert (q.ttft_ms, q.tpot_ms, q.weight) == (100, 15.0, 4.0)
    plain = c._query(2, {tp(0): _idle()}, RequestSpec(greedy(8)), 64, 8, 0)
    assert (plain.tpot_ms, plain.weight) == (None, 1.0)
