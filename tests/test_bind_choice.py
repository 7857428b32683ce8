"""Cost-aware binding (issue 32): the worker asks the cost model (binding/ through
`nitsum._core.BindingModel`) before a chosen binding and acts on it: DP on the replica it
names, bound for the prompt only (the KV then goes back to that replica), or in full with a
handback once the rest is cheaper in DP. CPU device processes of the tiny GQA model (TP 1/2);
the decisions come from profiles written here, the tokens from the real model."""

import logging

import pytest

from bind_helpers import ECFG, PAGES, Run, greedy, write_profile
from nitsum.engine.request_spec import RequestSpec
from shapes import layout, tp
from tiny import hf_greedy, make_tiny, tiny_device_pool
from tiny import random_prompt as prompt

# Spawns device processes: out of the fast lane (scripts/test.sh --fast).
pytestmark = pytest.mark.e2e

# TP 2 prefills 4x faster; its decode is no faster (TP decode of one request does not pay).
PREFILL_PAYS = ({1: 1.0, 2: 0.25}, {1: 10.0, 2: 10.0})
# TP 2 prefills 4x and decodes 2x faster.
BOTH_PAY = ({1: 1.0, 2: 0.25}, {1: 10.0, 2: 5.0})
# TP 2 is no faster at all.
NEVER_PAYS = ({1: 1.0, 2: 1.0}, {1: 10.0, 2: 10.0})


@pytest.fixture(scope="module")
def tiny():
    return make_tiny("llama-gqa")


@pytest.fixture(scope="module")
def pool(tiny):
    with tiny_device_pool(tiny, ECFG, devices=2, pages=PAGES, levels=(1, 2)) as pool:
        yield pool


def cost_run(pool, tiny, tmp_path, shape) -> Run:
    return Run(pool, tiny[1], binding_profile=write_profile(tmp_path / "p.json", *shape))


def busy_replicas(run: Run, ps: dict[str, list[int]], n: int = 16) -> None:
    """Requests "a" on (0,) and "b" on (1,), decoding after a few steps."""
    run.pe.add_request("a", ps["a"], RequestSpec(greedy(n)), group=tp(0))
    run.pe.add_request("b", ps["b"], RequestSpec(greedy(n)), group=tp(1))
    for _ in range(3):
        run.step()


def test_prefill_only_binding_hands_the_kv_back_after_the_prompt(pool, tiny, tmp_path) -> None:
    """Busy replicas, a strict TTFT, a profile where only TP prefill pays: the request is
    bound for its prompt, its KV goes to the replica the decision named right after its
    first token, the binding is released at that boundary (the replicas missed one
    iteration), and every request's tokens equal the reference, nothing recomputed."""
    hf, cfg = tiny
    run = cost_run(pool, tiny, tmp_path, PREFILL_PAYS)
    ps = {r: prompt(cfg, 20 + i, seed=70 + i) for i, r in enumerate("abs")}
    busy_replicas(run, ps)
    bound_at = run.n
    spec = RequestSpec(greedy(10), bind_tp=2, ttft_ms=30)
    assert run.pe.add_request("s", ps["s"], spec) == tp(0, 1)
    decision = run.pe.last_bind
    assert decision is not None and decision.mode == "prefill" and decision.level == 2
    replica = layout((0,), (1,))[decision.replica]
    run.step()
    assert run.steps["s"] == [bound_at]  # prompt and first token at TP 2
    assert not run.pe.binder.bindings and not run.pe.binder.paused()  # released at once
    assert "s" in run.pe.engines[replica].request_ids()
    assert not any(bound_at in run.steps[r] for r in "ab")  # paused for the prompt only
    run.step()
    assert all(bound_at + 1 in run.steps[r] for r in "abs")  # all three decode on replicas
    run.finish()
    for r, n in (("a", 16), ("b", 16), ("s", 10)):
        assert run.out[r] == hf_greedy(hf, ps[r], n), r
        assert run.computed[r] == len(ps[r]), r
    c = run.pe.all_counters()
    assert (c["bind_decisions_prefill"], c["bind_decisions_full"], c["tp_binds"]) == (1, 0, 1)
    assert c["bind_handbacks"] == 0 and c["kv_migrated_bytes"] > 0


def test_full_binding_hands_back_when_the_replicas_get_work(pool, tiny, tmp_path) -> None:
    """An idle block and a profile where TP pays both ways: bound in full. Once requests
    queue on the paused replicas, the cost model is asked again and the rest decodes on a
    replica (`bind_handbacks`); the tokens equal the reference's."""
    hf, cfg = tiny
    run = cost_run(pool, tiny, tmp_path, BOTH_PAY)
    ps = {r: prompt(cfg, 20 + i, seed=80 + i) for i, r in enumerate("sab")}
    spec = RequestSpec(greedy(16), bind_tp=2, ttft_ms=30)
    assert run.pe.add_request("s", ps["s"], spec) == tp(0, 1)
    assert run.pe.last_bind is not None and run.pe.last_bind.mode == "full"
    for _ in range(3):
        run.step()
    assert run.pe.binder.bindings and len(run.out["s"]) == 3  # no work waits: stays bound
    run.pe.add_request("a", ps["a"], RequestSpec(greedy(8)), group=tp(0))
    run.pe.add_request("b", ps["b"], RequestSpec(greedy(8)), group=tp(1))
    handed_at = run.n
    run.step()
    assert not run.pe.binder.bindings  # asked at once (the replicas' load changed): DP
    assert run.pe.last_bind is not None and run.pe.last_bind.mode == "dp"
    assert any("s" in e.request_ids() for e in run.pe.engines.values())
    run.finish()
    assert all(n > handed_at for r in "ab" for n in run.steps[r])
    for r, n in (("s", 16), ("a", 8), ("b", 8)):
        assert run.out[r] == hf_greedy(hf, ps[r], n), r
        assert run.computed[r] == len(ps[r]), r
    c = run.pe.all_counters()
    assert (c["bind_decisions_full"], c["bind_handbacks"], c["tp_binds"]) == (1, 1, 1)


def test_the_decision_weighs_the_blocks_real_state(pool, tiny, tmp_path) -> None:
    """Where binding buys nothing, a busy block answers DP on the replica where the request
    starts soonest (the lighter one), with the replicas' decoding batches in what the
    binding would cost; the same request on an idle block costs nothing either way."""
    hf, cfg = tiny
    run = cost_run(pool, tiny, tmp_path, NEVER_PAYS)
    ps = {r: prompt(cfg, 12 + i, seed=90 + i) for i, r in enumerate(("idle", "a", "c", "b", "s"))}
    run.pe.add_request("idle", ps["idle"], RequestSpec(greedy(4), bind_tp=2))
    idle = run.pe.last_bind
    assert idle is not None and all(o.lost_tokens == 0 for o in idle.options)
    run.finish()
    for r, g in (("a", tp(0)), ("c", tp(0)), ("b", tp(1))):
        run.pe.add_request(r, ps[r], RequestSpec(greedy(12)), group=g)
    for _ in range(3):
        run.step()
    assert run.pe.add_request("s", ps["s"], RequestSpec(greedy(6), bind_tp=2)) == tp(1)
    busy = run.pe.last_bind
    assert busy is not None and busy.mode == "dp" and busy.replica == 1
    full = next(o for o in busy.options if o.mode == "full")
    assert full.lost_tokens > 0 and full.value < busy.options[0].value
    assert not run.pe.binder.bindings
    run.finish()
    for r, n in (("idle", 4), ("a", 12), ("c", 12), ("b", 12), ("s", 6)):
        assert run.out[r] == hf_greedy(hf, ps[r], n), r
    c = run.pe.all_counters()
    assert c["bind_decisions_dp"] == 2 and c["tp_binds"] == 0


def test_a_profile_that_cannot_weigh_warns_and_binds_as_always(
    pool, tiny, tmp_path, caplog
) -> None:
    """A missing profile, an invalid one and one without TP 2 each log one warning and the
    pool binds every trigger (no decision taken); `bind_policy="always"` ignores a good one;
    a context no replica holds binds without asking even with a good profile."""
    hf, cfg = tiny
    (tmp_path / "bad.json").write_text("{not json")
    paths = [
        str(tmp_path / "missing.json"),
        str(tmp_path / "bad.json"),
        write_profile(tmp_path / "tp1.json", {1: 1.0}, {1: 10.0}),
    ]
    p = prompt(cfg, 16, seed=99)
    for path in paths:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="nitsum.pool.bind_choice"):
            run = Run(pool, cfg, binding_profile=path)
        assert [r.getMessage() for r in caplog.records if path in r.getMessage()], path
        assert run.pe.add_request("x", p, RequestSpec(greedy(4), bind_tp=2)) == tp(0, 1)
        run.finish()
        assert run.out["x"] == hf_greedy(hf, p, 4)
        assert run.pe.last_bind is None
        assert run.pe.all_counters()["bind_decisions_dp"] == 0
    good = write_profile(tmp_path / "good.json", *NEVER_PAYS)
    always = Run(pool, cfg, binding_profile=good, bind_policy="always")
    assert always.pe.add_request("y", p, RequestSpec(greedy(4), bind_tp=2)) == tp(0, 1)
    always.finish()
    assert always.pe.last_bind is None
    cost = Run(pool, cfg, binding_profile=good)
    long = prompt(cfg, 100, seed=98)
    assert cost.pe.add_request("long", long, RequestSpec(greedy(8), bind_tp=2)) == tp(0, 1)
    cost.finish()
    assert cost.out["long"] == hf_greedy(hf, long, 8) and cost.pe.last_bind is None
