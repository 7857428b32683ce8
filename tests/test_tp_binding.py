"""Per-request TP binding (issue 14, Flying Serving): DP replicas bound into a TP group for a
request and released after, on CPU device processes of the tiny GQA model (TP 1/2)."""

import threading

import pytest

import device_probes
from nitsum.engine.engine_config import EngineConfig
from nitsum.engine.request_spec import RequestSpec
from nitsum.errors import InvalidRequestError
from nitsum.pool.device_commands import Counters, Probe
from nitsum.pool.device_pool import DevicePool
from nitsum.pool.pool_engine import PoolEngine
from nitsum.sampling import SamplingParams
from tiny import hf_greedy, make_tiny, tiny_device_pool
from tiny import random_prompt as prompt

# Spawns processes (devices, workers, router): out of the fast lane (scripts/test.sh --fast).
pytestmark = pytest.mark.e2e

P = 4
PAGES = 20  # one device holds 80 tokens at TP 1, a TP-2 group 160
ECFG = EngineConfig(page_tokens=P, token_budget=64, tp_levels=(1, 2), prefix_caching=False)


@pytest.fixture(scope="module")
def tiny():
    return make_tiny("llama-gqa")


@pytest.fixture(scope="module")
def pool(tiny):
    with tiny_device_pool(tiny, ECFG, devices=2, pages=PAGES, levels=(1, 2)) as pool:
        yield pool


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)


class Run:
    """A PoolEngine of two DP replicas; records every request's tokens, the steps they came
    in, and the prompt tokens each engine computed for each request."""

    def __init__(self, pool: DevicePool, cfg) -> None:
        self.pe = PoolEngine(pool, cfg, ECFG, PAGES, [(0,), (1,)])
        self.out: dict[str, list[int]] = {}
        self.steps: dict[str, list[int]] = {}
        self.computed: dict[str, int] = {}
        self.n = 0

    def step(self) -> None:
        for engine in [*self.pe.engines.values(), *(e for _, e in self.pe.binder.engines())]:
            self._watch(engine)
        for o in self.pe.step():
            self.out.setdefault(o.request_id, []).extend(o.new_token_ids)
            self.steps.setdefault(o.request_id, []).append(self.n)
        self.n += 1

    def _watch(self, engine) -> None:
        if getattr(engine, "_watched", False):
            return
        plain = engine.begin_step

        def begin_step():
            batch = plain()
            for s in batch:
                if s.start < len(s.seq.prompt_ids):
                    rid = s.seq.request_id
                    self.computed[rid] = self.computed.get(rid, 0) + s.q_len
            return batch

        engine.begin_step, engine._watched = begin_step, True

    def finish(self) -> None:
        while self.pe.has_unfinished():
            self.step()
        self.step()  # the release happens at the end of a step
        assert not self.pe.binder.bindings
        for d, (used, owned) in self.pe.page_accounting().items():
            assert used == owned == set(), d


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
    assert group == (0, 1) and run.pe.binder.bindings[0].hard is False
    run.finish()
    assert run.out["long"] == hf_greedy(hf, long, 20)
    assert run.pe.all_counters()["tp_binds"] == 1
    short = prompt(cfg, 20, seed=2)
    assert run.pe.add_request("short", short, RequestSpec(greedy(8)), group=(1,)) == (1,)
    run.finish()
    assert run.out["short"] == hf_greedy(hf, short, 8)
    with pytest.raises(InvalidRequestError):
        run.pe.add_request("too-long", prompt(cfg, 170, seed=3), RequestSpec(greedy(4)))
    # A tier's bind_tp beyond the pool's levels binds the largest one below it.
    assert run.pe.add_request("four", short, RequestSpec(greedy(2), bind_tp=4, ttft_ms=900)) == (
        0,
        1,
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
    run.pe.add_request("a", ps["a"], RequestSpec(greedy(16)), group=(0,))
    run.pe.add_request("b", ps["b"], RequestSpec(greedy(16)), group=(1,))
    for _ in range(4):
        run.step()
    bound_at = run.n
    assert run.pe.add_request("s", ps["s"], RequestSpec(greedy(6), bind_tp=2, ttft_ms=500)) == (
        0,
        1,
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


def test_soft_binding_starts_in_dp_and_moves_when_the_group_forms(run, tiny) -> None:
    """Replica 0 is busy, replica 1 idle: the request starts there in DP mode; once replica 0
    finished its request the group forms, the request's KV moves to the TP-2 layout and it
    goes on there; its tokens equal the reference."""
    hf, cfg = tiny
    busy, req = prompt(cfg, 30, seed=20), prompt(cfg, 40, seed=21)
    run.pe.add_request("busy", busy, RequestSpec(greedy(6)), group=(0,))
    run.step()
    assert run.pe.add_request("soft", req, RequestSpec(greedy(24), bind_tp=2, bind_hard=False)) == (
        1,
    )
    b = run.pe.binder.bindings[0]
    run.pe.add_request("later", prompt(cfg, 10, seed=22), RequestSpec(greedy(4)), group=(0,))
    while not b.formed:
        run.step()
    in_dp = len(run.out.get("soft", []))
    assert in_dp > 0 and "later" not in run.out  # drained: nothing new started on (0,)
    run.finish()
    assert run.out["soft"] == hf_greedy(hf, req, 24)
    assert run.out["busy"] == hf_greedy(hf, busy, 6)
    c = run.pe.all_counters()
    assert c["tp_binds_soft"] == 1 and c["kv_migrated_bytes"] > 0
    assert run.computed["soft"] == len(req)  # its KV moved, not recomputed


def test_no_deadlock_when_a_replica_lags(run, pool, tiny) -> None:
    """Device 0's forwards take 0.2 s longer: a hard binding still forms at the next boundary
    and completes (no rank waits in a collective for a peer busy elsewhere)."""
    hf, cfg = tiny
    pool.call(0, Probe(device_probes.slow_steps, (0.2,)))
    try:
        ps = {r: prompt(cfg, 20 + i, seed=30 + i) for i, r in enumerate("abs")}
        run.pe.add_request("a", ps["a"], RequestSpec(greedy(6)), group=(0,))
        run.pe.add_request("b", ps["b"], RequestSpec(greedy(6)), group=(1,))
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
    pe = PoolEngine(pool, cfg, replace(ECFG, bind_idle=True), PAGES, [(0,), (1,)])
    ps = [prompt(cfg, 16, seed=40 + i) for i in range(3)]
    assert pe.add_request("idle", ps[0], RequestSpec(greedy(4), ttft_ms=500), group=(0,)) == (0, 1)
    assert pe.add_request("bulk", ps[1], RequestSpec(greedy(4)), group=(1,)) == (1,)  # no TTFT: DP
    out: dict[str, list[int]] = {}
    while pe.has_unfinished():
        for o in pe.step():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
    pe.add_request("busy", ps[1], RequestSpec(greedy(30)), group=(1,))
    pe.step()
    assert pe.add_request("strict", ps[2], RequestSpec(greedy(4), ttft_ms=500), group=(0,)) == (0,)
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
    pe = PoolEngine(pool, cfg, replace(ECFG, prefix_caching=True), PAGES, [(0,), (1,)])
    for i, g in enumerate(((0,), (1,))):
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
    assert pe.binder.bindings and pe.binder.paused() == {(0,), (1,)}
    assert pe.abort("gone")
    assert not pe.binder.bindings and not pe.binder.paused()
    c = pe.all_counters()
    assert (c["tp_binds"], c["tp_bound_requests"]) == (2, 2)


def test_a_group_failing_to_begin_a_step_fails_alone(run, tiny) -> None:
    """A group whose step cannot begin (e.g. a swap copy failed) fails its own requests
    with an error; the other group's launched step is still collected and it finishes."""
    hf, cfg = tiny
    ps = [prompt(cfg, 12, seed=60 + i) for i in range(2)]
    run.pe.add_request("ok", ps[0], RequestSpec(greedy(6)), group=(0,))
    run.pe.add_request("bad", ps[1], RequestSpec(greedy(6)), group=(1,))
    broken = run.pe.engines[(1,)]

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
