"""Switching between TP and (tp, pp) pipelines mid-decode on 4 CPU devices: 2-D KV migration
(layers x heads), the capacity check, and the switch as a transaction (failure per phase)."""

from dataclasses import replace

import pytest

from nitsum.engine.request_spec import RequestSpec
from nitsum.parallel.topology import GroupShape
from nitsum.pool.device_loss import lose_device
from nitsum.pool.device_pool import DevicePool
from nitsum.pool.device_proc import ModelSource
from nitsum.pool.faults import FaultPlan
from nitsum.pool.pool_engine import PoolEngine
from nitsum.sampling import SamplingParams
from shapes import tp
from tiny import (
    POOL_ECFG,
    POOL_PAGES,
    assert_pages_consistent,
    drain,
    hf_greedy,
    layout_slices,
    make_tiny,
    random_prompt,
)

# Spawns processes (devices, workers, router): out of the fast lane (scripts/test.sh --fast).
pytestmark = pytest.mark.e2e

ALL = (0, 1, 2, 3)
TP4 = [GroupShape.tp_group(ALL)]
TP2 = [tp(0, 1), tp(2, 3)]
TP2_PP2 = [GroupShape(ALL, 2, 2)]
TP1_PP4 = [GroupShape(ALL, 1, 4)]
ECFG = replace(POOL_ECFG, prefix_caching=False)


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny_pool():
    hf, cfg = make_tiny("llama-deep")  # 4 layers, 4 KV heads
    source = ModelSource(hf_config=cfg.extra, state_dict=hf.state_dict())
    with DevicePool(4, source, POOL_ECFG, POOL_PAGES, levels=(1, 2, 4)) as pool:
        yield hf, cfg, pool


def test_switches_through_pipelines_keep_greedy_tokens(tiny_pool):
    """TP4 → (2,2) → (1,4) → TP4, a few decode steps in each: HF's greedy tokens, the allocator
    agrees with every sequence after each switch, and the bytes sent are exactly the
    (layer, head) slices whose owner changed."""
    hf, cfg, pool = tiny_pool
    prompts = [random_prompt(cfg, 5 + 3 * i, 40 + i) for i in range(4)]
    pe = PoolEngine(pool, cfg, ECFG, POOL_PAGES, TP4)
    for i, p in enumerate(prompts):
        pe.add_request(f"r{i}", p, RequestSpec(greedy(16)))
    out: dict[str, list[int]] = {}
    current = TP4
    slice_bytes = 2 * cfg.head_dim * 4  # one (layer, head) of one token: K and V, fp32
    for layout in (TP2_PP2, TP1_PP4, TP4):
        drain(pe, out, steps=3)
        tokens = sum(s.num_computed for e in pe.engines.values() for s in e.sequences())
        before, after = layout_slices(cfg, current), layout_slices(cfg, layout)
        changed = sum(len(after[d] - before[d]) for d in after)
        report = pe.reconfigure(layout)
        assert report.ok, report.error
        assert pe.groups == layout
        assert_pages_consistent(pe)
        assert report.bytes_sent == changed * tokens * slice_bytes
        current = layout
    drain(pe, out)
    assert out == {f"r{i}": hf_greedy(hf, p, 16) for i, p in enumerate(prompts)}
    assert pe.counters["pp_steps"] > 0
    assert [entry["ok"] for entry in pe.switch_log] == [True] * 3


def test_shrinking_switch_preempts_exactly_the_predicted_requests(tiny_pool):
    """A (1,4) pipeline's pages hold 4x fewer tokens than TP4's: switching a full TP4 group to
    it preempts the lowest-priority requests, exactly those `plan_switch` named, and they
    finish later with HF's tokens."""
    hf, cfg, pool = tiny_pool
    pages = 36  # TP4: 16 tokens a page; (1,4): 4
    pe = PoolEngine(pool, cfg, ECFG, pages, TP4)
    prompts = [random_prompt(cfg, 30, 60 + i) for i in range(6)]
    for i, p in enumerate(prompts):
        # r0 is the most important (lowest priority value), r5 the least.
        pe.add_request(f"r{i}", p, RequestSpec(greedy(8), priority=i))
    out = drain(pe, {}, steps=4)  # every prompt prefilled (64 tokens a step), then decoding
    computed = sorted(s.num_computed for s in pe.engines[GroupShape.tp_group(ALL)].sequences())
    assert computed[0] >= 30 and computed[-1] <= 32 + 1
    predicted = pe.plan_switch(TP1_PP4)
    # 31-33 tokens need 8-9 pages at (1,4) and 3 at TP4. NOTE: the TP4 pages stay allocated
    # until the commit (the transfer reads them), so 36 - 6 * 3 = 18 pages take 2 requests:
    # the 4 of lowest priority go, lowest first.
    assert predicted == ["r5", "r4", "r3", "r2"]
    report = pe.reconfigure(TP1_PP4)
    assert report.ok, report.error
    assert report.preempted == predicted
    assert_pages_consistent(pe)
    drain(pe, out)
    assert out == {f"r{i}": hf_greedy(hf, p, 8) for i, p in enumerate(prompts)}


@pytest.mark.parametrize("phase", ["plan", "capacity", "transfer", "commit", "after_commit"])
def test_a_failure_before_commit_leaves_the_old_layout(tiny_pool, phase):
    """A failure injected in each phase: before the commit point the old layout stays whole
    (groups, pages, tokens); after it the new layout is in force."""
    hf, cfg, pool = tiny_pool
    prompts = [random_prompt(cfg, 9, 80 + i) for i in range(3)]
    pe = PoolEngine(pool, cfg, ECFG, POOL_PAGES, TP4)
    for i, p in enumerate(prompts):
        pe.add_request(f"r{i}", p, RequestSpec(greedy(10)))
    out = drain(pe, {}, steps=3)
    before = pe.page_accounting()
    layouts = {s.request_id: s.layout for e in pe.engines.values() for s in e.sequences()}
    if phase == "transfer":
        report = pe.reconfigure(TP2_PP2, faults=FaultPlan(transfer=(1, 0)))
    else:
        report = pe.reconfigure(TP2_PP2, faults=FaultPlan(phase=phase))
    assert report.error is not None and ("failed" in report.error or phase in report.error)
    if phase == "after_commit":
        assert report.ok and pe.groups == TP2_PP2
        assert all(s.layout == TP2_PP2[0] for e in pe.engines.values() for s in e.sequences())
    else:
        assert not report.ok and pe.groups == TP4
        assert pe.page_accounting() == before
        assert {s.request_id: s.layout for e in pe.engines.values() for s in e.sequences()} == (
            layouts
        )
    assert pe.switch_log[-1]["ok"] == report.ok
    drain(pe, out)
    assert out == {f"r{i}": hf_greedy(hf, p, 10) for i, p in enumerate(prompts)}
    assert_pages_consistent(pe)


def test_unknown_pipelines_are_refused_clearly(tiny_pool):
    _, cfg, pool = tiny_pool
    pe = PoolEngine(pool, cfg, ECFG, POOL_PAGES, TP4)
    with pytest.raises(ValueError, match=r"no pipeline \[0, 1, 2\] \(TP 1 x PP 3\)"):
        pe.reconfigure([GroupShape((0, 1, 2), 1, 3)])
    with pytest.raises(ValueError, match="overlaps"):
        pe.reconfigure([GroupShape((0, 1), 1, 2), *TP4])
    with pytest.raises(ValueError, match="are not 2 stage"):
        GroupShape((0, 1, 2), 2, 2)
    assert pe.groups == TP4


def test_a_dead_device_before_the_transfer_leaves_the_old_layout():
    """A rank that crashed: the switch fails cleanly (nothing is sent to the live ranks, so
    none waits on a dead peer) and the host keeps the old layout and pages."""
    hf, cfg = make_tiny("llama-deep")
    source = ModelSource(hf_config=cfg.extra, state_dict=hf.state_dict())
    with DevicePool(4, source, POOL_ECFG, POOL_PAGES, levels=(1, 2, 4)) as pool:
        pe = PoolEngine(pool, cfg, ECFG, POOL_PAGES, TP2)
        for i in range(4):
            pe.add_request(f"r{i}", random_prompt(cfg, 9, 90 + i), RequestSpec(greedy(10)))
        drain(pe, {}, steps=3)
        before = pe.page_accounting()
        pool.procs[3].kill()
        pool.procs[3].join()
        report = pe.reconfigure(TP2_PP2)
        assert not report.ok and "device 3 is gone" in report.error
        assert pe.groups == TP2 and pe.page_accounting() == before
        # The dead group's requests are handed back unanswered (the host worker's
        # `lose_device`, for the router to resume); the live group still serves.
        dropped = lose_device(pe, 3)
        assert len(dropped) == 2, dropped
        assert tp(2) in pe.groups and 3 in pe.solo
        finals = {}
        while pe.has_unfinished():
            for o in pe.step():
                if o.finished:
                    finals[o.request_id] = o.finish_reason
        assert set(finals) == {f"r{i}" for i in range(4)} - set(dropped)
        assert list(finals.values()) == ["length", "length"]


def test_a_reshaped_group_gives_its_cache_back_and_keeps_its_counters(tiny_pool):
    """The same devices from TP4 to a (1,4) pipeline with the prefix cache on: the old engine
    is retired like a vanishing one (its cached pages freed first, counted in plan_switch; its
    counters kept), and nothing leaks."""
    hf, cfg, pool = tiny_pool
    pe = PoolEngine(pool, cfg, POOL_ECFG, 46, TP4)  # the cache on
    done = [random_prompt(cfg, 24, 100 + i) for i in range(2)]
    for i, p in enumerate(done):
        pe.add_request(f"d{i}", p, RequestSpec(greedy(2)))
    drain(pe, {})  # finished: their full pages stay cached
    assert pe.engines[GroupShape.tp_group(ALL)].cached_pages()
    prompts = [random_prompt(cfg, 30, 110 + i) for i in range(4)]
    for i, p in enumerate(prompts):
        pe.add_request(f"r{i}", p, RequestSpec(greedy(6), priority=i))
    out = drain(pe, {}, steps=3)
    queries = pe.all_counters()["prefix_cache_queries"]
    predicted = pe.plan_switch(TP1_PP4)
    report = pe.reconfigure(TP1_PP4)
    assert report.ok and report.preempted == predicted
    assert_pages_consistent(pe)
    assert pe.all_counters()["prefix_cache_queries"] >= queries
    drain(pe, out)
    assert out == {f"r{i}": hf_greedy(hf, p, 6) for i, p in enumerate(prompts)}
    assert_pages_consistent(pe)
