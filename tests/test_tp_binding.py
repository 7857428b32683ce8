"""Per-request TP binding (issue 14, Flying Serving): DP replicas bound into a TP group for a
request and released after, on CPU device processes of the tiny GQA model (TP 1/2)."""

import threading

import pytest

import device_probes
from bind_helpers import ECFG, PAGES, Run, greedy
from nitsum.engine.request_spec import RequestSpec
from nitsum.errors import InvalidRequestError
from nitsum.pool.device_commands import Counters, Probe
from nitsum.pool.pool_engine import PoolEngine
from shapes import layout, tp
from tiny import hf_greedy, make_tiny, tiny_device_pool
from tiny import random_prompt as prompt

# Spawns processes (devices, workers, router): out of the fast lane (scripts/test.sh --fast).
pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def tiny():
    return make_tiny("llama-gqa")


@pytest.fixture(scope="module")
def pool(tiny):
    with tiny_device_pool(tiny, ECFG, devices=2, pages=PAGES, levels=(1, 2)) as pool:
        yield pool


@pytest.fixture
def run(pool, tiny):
    return Run(pool, tiny[1])


def test_a_prompt_longer_than_a_device_runs_on_a_bound_group(run, tiny) -> None:
    """100 prompt tokens + 20 out do not fit one device's 80 tokens: the request is served at
    TP 2 (160 tokens) instead of refused, with the reference tokens; after release the
    replicas serve DP again."""
    hf, cfg = tiny
    long = prompt(cfg, 100, seed=1)
    assert run.pe.max_servable_tokens() == 160
    group = run.pe.add_request("long", long, RequestSpec(greedy(20)))
    assert group == tp(0, 1) and run.pe.binder.bindings[0].hard is False
    run.finish()
    assert run.out["long"] == hf_greedy(hf, long, 20)
    assert run.pe.all_counters()["tp_binds"] == 1
    short = prompt(cfg, 20, seed=2)
    assert run.pe.add_request("short", short, RequestSpec(greedy(8)), group=tp(1)) == tp(1)
    run.finish()
    assert run.out["short"] == hf_greedy(hf, short, 8)
    with pytest.raises(InvalidRequestError):
        run.pe.add_request("too-long", prompt(cfg, 170, seed=3), RequestSpec(greedy(4)))
    # A tier's bind_tp beyond the pool's levels binds the largest one below it.
    assert run.pe.add_request("four", short, RequestSpec(greedy(2), bind_tp=4, ttft_ms=900)) == tp(
        0, 1
    )
    run.finish()
    assert run.out["four"] == hf_greedy(hf, short, 2)
    assert run.pe.all_counters()["tp_binds_clamped"] == 1


def test_hard_binding_pauses_replicas_with_their_kv_intact(run, pool, tiny) -> None:
    """DP requests a and b decode on their replicas; a strict request bound at TP 2 stops both
    at once and runs alone; a and b resume after release with identical tokens and nothing
    recomputed; no process group is created on the way."""
    hf, cfg = tiny
    created = [pool.call(d, Counters())["groups_created"] for d in range(2)]
    ps = {r: prompt(cfg, 24 + i, seed=10 + i) for i, r in enumerate("abs")}
    run.pe.add_request("a", ps["a"], RequestSpec(greedy(16)), group=tp(0))
    run.pe.add_request("b", ps["b"], RequestSpec(greedy(16)), group=tp(1))
    for _ in range(4):
        run.step()
    bound_at = run.n
    assert run.pe.add_request("s", ps["s"], RequestSpec(greedy(6), bind_tp=2, ttft_ms=500)) == tp(
        0, 1
    )
    run.finish()
    s_steps = run.steps["s"]
    assert s_steps[0] == bound_at  # started at once
    during = range(bound_at, s_steps[-1] + 1)
    assert not any(n in during for r in "ab" for n in run.steps[r])  # paused meanwhile
    for r, n in (("a", 16), ("b", 16), ("s", 6)):
        assert run.out[r] == hf_greedy(hf, ps[r], n), r
        assert run.computed[r] == len(ps[r]), r  # no KV recomputed
    assert run.pe.all_counters()["num_preemptions"] == 0
    assert [pool.call(d, Counters())["groups_created"] for d in range(2)] == created


def test_soft_binding_alternates_iterations_with_its_replicas(run, tiny) -> None:
    """Both replicas are busy; a soft binding forms at once, without draining them: the bound
    request and the replicas' requests take turns, iteration by iteration (never both in
    one), a request queued on a replica meanwhile starts before the binding ends, and every
    request's tokens equal the reference with nothing recomputed."""
    hf, cfg = tiny
    ps = {r: prompt(cfg, 20 + i, seed=20 + i) for i, r in enumerate(("a", "b", "soft", "later"))}
    run.pe.add_request("a", ps["a"], RequestSpec(greedy(16)), group=tp(0))
    run.pe.add_request("b", ps["b"], RequestSpec(greedy(16)), group=tp(1))
    run.step()
    bound_at = run.n
    spec = RequestSpec(greedy(12), bind_tp=2, bind_hard=False)
    assert run.pe.add_request("soft", ps["soft"], spec) == tp(0, 1)
    run.pe.add_request("later", ps["later"], RequestSpec(greedy(4)), group=tp(0))
    for _ in range(6):
        run.step()
    window = range(bound_at, bound_at + 6)
    soft = [n for n in run.steps["soft"] if n in window]
    replicas = {n for r in ("a", "b") for n in run.steps[r] if n in window}
    assert soft == [bound_at, bound_at + 2, bound_at + 4]  # its turn first, then every other
    assert replicas == {bound_at + 1, bound_at + 3, bound_at + 5}
    assert run.pe.binder.bindings  # still bound: "later" did not wait for the release
    assert run.steps["later"][0] < run.steps["soft"][-1]
    run.finish()
    for r, n in (("a", 16), ("b", 16), ("soft", 12), ("later", 4)):
        assert run.out[r] == hf_greedy(hf, ps[r], n), r
        assert run.computed[r] == len(ps[r]), r
    c = run.pe.all_counters()
    assert c["tp_binds_soft"] == 1 and c["bind_soft_yields"] >= 3
    assert c["num_preemptions"] == 0


def test_a_hard_request_joining_a_soft_binding_stops_the_alternation(run, tiny) -> None:
    """A strict request bound where a soft binding alternates joins it, and from then on the
    replicas pause while it runs (the TTFT tier's hard binding); tokens equal the reference."""
    hf, cfg = tiny
    ps = {r: prompt(cfg, 16 + i, seed=25 + i) for i, r in enumerate(("a", "soft", "s"))}
    run.pe.add_request("a", ps["a"], RequestSpec(greedy(20)), group=tp(0))
    run.pe.add_request("soft", ps["soft"], RequestSpec(greedy(20), bind_tp=2, bind_hard=False))
    run.step()
    run.step()
    assert run.pe.add_request("s", ps["s"], RequestSpec(greedy(4), bind_tp=2, ttft_ms=500)) == tp(
        0, 1
    )
    joined = run.n
    for _ in range(4):
        run.step()
    assert not any(joined <= n < joined + 4 for n in run.steps["a"])  # paused meanwhile
    assert run.steps["s"] == list(range(joined, joined + 4))
    run.finish()
    for r, n in (("a", 20), ("soft", 20), ("s", 4)):
        assert run.out[r] == hf_greedy(hf, ps[r], n), r


def test_no_deadlock_when_a_replica_lags(run, pool, tiny) -> None:
    """Device 0's forwards take 0.2 s longer: a hard binding still forms at the next boundary
    and completes (no rank waits in a collective for a peer busy elsewhere)."""
    hf, cfg = tiny
    pool.call(0, Probe(device_probes.slow_steps, (0.2,)))
    try:
        ps = {r: prompt(cfg, 20 + i, seed=30 + i) for i, r in enumerate("abs")}
        run.pe.add_request("a", ps["a"], RequestSpec(greedy(6)), group=tp(0))
        run.pe.add_request("b", ps["b"], RequestSpec(greedy(6)), group=tp(1))
        run.step()
        run.pe.add_request("s", ps["s"], RequestSpec(greedy(4), bind_tp=2, ttft_ms=100))
        done = threading.Event()

        def finish() -> None:
            run.finish()
            done.set()

        t = threading.Thread(target=finish, daemon=True)
        t.start()
        assert done.wait(60), "the binding never completed"
        for r, n in (("a", 6), ("b", 6), ("s", 4)):
            assert run.out[r] == hf_greedy(hf, ps[r], n), r
    finally:
        pool.call(0, Probe(device_probes.slow_steps, (0.0,)))


def test_light_load_binds_idle_replicas_for_a_strict_request(pool, tiny) -> None:
    """The load trigger: with every replica idle a request with a TTFT target runs bound at
    TP 2; with one replica busy it stays DP (and one without a TTFT target always does)."""
    from dataclasses import replace

    hf, cfg = tiny
    pe = PoolEngine(
        pool,
        cfg,
        replace(ECFG, bind_idle=True),
        PAGES,
        layout((0,), (1,)),
    )
    ps = [prompt(cfg, 16, seed=40 + i) for i in range(3)]
    assert pe.add_request("idle", ps[0], RequestSpec(greedy(4), ttft_ms=500), group=tp(0)) == tp(
        0, 1
    )
    assert pe.add_request("bulk", ps[1], RequestSpec(greedy(4)), group=tp(1)) == tp(
        1
    )  # no TTFT: DP
    out: dict[str, list[int]] = {}
    while pe.has_unfinished():
        for o in pe.step():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
    pe.add_request("busy", ps[1], RequestSpec(greedy(30)), group=tp(1))
    pe.step()
    assert pe.add_request("strict", ps[2], RequestSpec(greedy(4), ttft_ms=500), group=tp(0)) == tp(
        0
    )
    while pe.has_unfinished():
        for o in pe.step():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
    assert out["idle"] == hf_greedy(hf, ps[0], 4)
    assert out["strict"] == hf_greedy(hf, ps[2], 4)
    assert pe.all_counters()["tp_binds"] == 1


def test_a_bound_group_gets_the_pages_the_replicas_cache(pool, tiny) -> None:
    """With the prefix cache on, finished requests leave the replicas' pages cached; a long
    request bound later still gets them (the replicas' idle cached pages give way when the
    group forms), and an abort of the last bound request releases the binding at once."""
    from dataclasses import replace

    hf, cfg = tiny
    pe = PoolEngine(
        pool,
        cfg,
        replace(ECFG, prefix_caching=True),
        PAGES,
        layout((0,), (1,)),
    )
    for i, g in enumerate((tp(0), tp(1))):
        pe.add_request(f"warm{i}", prompt(cfg, 64, seed=50 + i), RequestSpec(greedy(4)), group=g)
    while pe.has_unfinished():
        pe.step()
    assert all(e.num_evictable() >= 15 for e in pe.engines.values())
    long = prompt(cfg, 100, seed=52)
    pe.add_request("long", long, RequestSpec(greedy(20), ttft_ms=5000))
    out: list[int] = []
    for _ in range(100):
        if not pe.has_unfinished():
            break
        out += [t for o in pe.step() for t in o.new_token_ids]
    assert out == hf_greedy(hf, long, 20)
    pe.step()
    assert not pe.binder.bindings
    pe.add_request("gone", prompt(cfg, 8, seed=53), RequestSpec(greedy(4), bind_tp=2, ttft_ms=500))
    assert pe.binder.bindings and pe.binder.paused() == {tp(0), tp(1)}
    assert pe.abort("gone")
    assert not pe.binder.bindings and not pe.binder.paused()
    c = pe.all_counters()
    assert (c["tp_binds"], c["tp_bound_requests"]) == (2, 2)


def test_a_group_failing_to_begin_a_step_fails_alone(run, tiny) -> None:
    """A group whose step cannot begin (e.g. a swap copy failed) fails its own requests
    with an error; the other group's launched step is still collected and it finishes."""
    hf, cfg = tiny
    ps = [prompt(cfg, 12, seed=60 + i) for i in range(2)]
    run.pe.add_request("ok", ps[0], RequestSpec(greedy(6)), group=tp(0))
    run.pe.add_request("bad", ps[1], RequestSpec(greedy(6)), group=tp(1))
    broken = run.pe.engines[tp(1)]

    def fail():
        raise RuntimeError("swap copy failed: boom")

    broken.begin_step = fail
    outs = run.pe.step()
    for o in outs:
        run.out.setdefault(o.request_id, []).extend(o.new_token_ids)
    assert [(o.request_id, o.finish_reason) for o in outs if o.request_id == "bad"] == [
        ("bad", "error")
    ]
    del broken.begin_step
    run.finish()
    assert run.out["ok"] == hf_greedy(hf, ps[0], 6)
