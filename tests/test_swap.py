"""Preemption by KV swap (issue 13, items 2-3): a host tier per device, page runs copied as
one, swap chosen over recompute by cost; tokens unchanged, every page back in its pool."""

import pytest
import torch

from nitsum.engine.build import build_engine
from nitsum.engine.engine_config import EngineConfig
from nitsum.engine.request_spec import RequestSpec
from nitsum.kv.cache import KVCache
from nitsum.kv.host_tier import HostKVTier, runs
from nitsum.sampling import SamplingParams
from shapes import tp
from tiny import hf_greedy, kv_bytes, make_tiny, run_arrivals, tiny_device_pool
from tiny import random_prompt as prompt

P = 4
LONG = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)


def test_runs_group_consecutive_pages() -> None:
    assert runs([3, 4, 5, 9, 10, 2], [0, 1, 2, 3, 4, 8]) == [(3, 0, 3), (9, 3, 2), (2, 8, 1)]
    assert runs([], []) == []


def test_host_tier_moves_exact_bytes_in_runs(tiny) -> None:
    hf, cfg = tiny
    pool = KVCache(cfg, 16, P)
    pool.storage.normal_()
    host = HostKVTier(pool, 8)
    before = pool.storage.clone()
    stats = host.swap([(5, 0), (6, 1), (7, 2), (12, 6)], [])
    page = pool.storage[:, :, 0].numel() * 4
    assert (stats.bytes, stats.copies) == (4 * page, 2)
    assert torch.equal(host.storage[:, :, 0:3], before[:, :, 5:8])
    assert torch.equal(host.storage[:, :, 6], before[:, :, 12])
    pool.storage.zero_()
    stats = host.swap([], [(0, 9), (1, 10), (6, 2)])
    assert (stats.bytes, stats.copies) == (3 * page, 2)
    assert torch.equal(pool.storage[:, :, 9:11], before[:, :, 5:7])
    assert torch.equal(pool.storage[:, :, 2], before[:, :, 12])


@pytest.fixture(scope="module")
def tiny():
    return make_tiny("llama-gqa")


def engine_for(tiny, pages: int, host_pages: int, **kw):
    hf, cfg = tiny
    ecfg = EngineConfig(
        kv_cache_bytes=kv_bytes(cfg, pages),
        host_kv_cache_bytes=kv_bytes(cfg, host_pages),
        page_tokens=P,
        token_budget=64,
        **kw,
    )
    return build_engine(cfg, hf.state_dict().items(), ecfg)


@pytest.mark.parametrize("caching", [False, True])
def test_a_strict_request_swaps_background_ones_out_and_they_finish_unchanged(
    tiny, caching: bool
) -> None:
    """A full engine (batch of 2): a strict request arrives mid-decode, the newest background
    request is swapped out (its 11 pages copied to host in one run), the strict one starts at
    once; the background one comes back from host and finishes with the reference tokens.
    With the prefix cache on, its pages that nobody overwrote need no copy back."""
    hf, cfg = tiny
    engine = engine_for(tiny, pages=64, host_pages=32, max_batch=2, prefix_caching=caching)
    engine.scheduler.swap.bytes_per_s = 1e15  # copies cost nothing: always swap
    ps = {r: prompt(cfg, 30 + i, seed=i) for i, r in enumerate(("bg0", "bg1", "strict"))}
    bg = [
        (r, ps[r], RequestSpec(LONG, slo_class="background", tier="background"))
        for r in ("bg0", "bg1")
    ]
    strict = [("strict", ps["strict"], RequestSpec(LONG, slo_class="feasible", tier="s"))]
    out, first = run_arrivals(engine, {0: bg, 12: strict})
    assert first["strict"] == 12, first
    for r, p in ps.items():
        assert out[r] == hf_greedy(hf, p, 24), r
    c = engine.counters()
    assert (c["num_preemptions"], c["num_preemptions_swap"]) == (1, 1)
    # bg1 had 31 + 11 tokens computed: 11 pages (the last partial), in one run of page ids.
    assert c["swap_out_pages"] == 11 and c["swap_copies"] >= 1
    if caching:
        assert c["swap_in_pages"] < 11  # its full pages still on the device came back free
    else:
        assert c["swap_in_pages"] == 11
    assert c["swap_bytes"] == (c["swap_out_pages"] + c["swap_in_pages"]) * kv_bytes(cfg, 1)
    s = engine.scheduler
    assert s.num_reclaimable() == s.pages.num_pages
    assert s.swap.host.num_free == s.swap.host.num_pages


def test_short_contexts_recompute_and_abort_frees_host_pages(tiny) -> None:
    hf, cfg = tiny
    engine = engine_for(tiny, pages=64, host_pages=32, max_batch=1, prefix_caching=False)
    s = engine.scheduler
    # Copies slower than recomputing (its 40-token prompt timed a full step): recompute.
    s.swap.bytes_per_s = 1.0
    out, _ = run_arrivals(
        engine,
        {
            0: [("bg", prompt(cfg, 40, 1), RequestSpec(LONG, slo_class="background", tier="b"))],
            3: [("strict", prompt(cfg, 9, 2), RequestSpec(LONG, slo_class="feasible", tier="s"))],
        },
    )
    assert (s.preemptions, s.swapped) == (1, 0)
    # Copies cheap: swap; then abort the swapped-out request while it waits on host.
    s.swap.bytes_per_s = 1e15
    engine.add_request(
        "bg2", prompt(cfg, 30, 3), RequestSpec(LONG, slo_class="background", tier="b")
    )
    for _ in range(3):
        engine.step()
    engine.add_request(
        "strict2", prompt(cfg, 9, 4), RequestSpec(LONG, slo_class="feasible", tier="s")
    )
    engine.step()
    assert s.swapped == 1 and s.swap.host.num_free < s.swap.host.num_pages
    assert engine.abort("bg2")
    assert s.swap.host.num_free == s.swap.host.num_pages
    run_arrivals(engine, {})
    assert s.num_reclaimable() == s.pages.num_pages


@pytest.mark.e2e
def test_swap_on_a_tp2_group_of_device_processes(tiny) -> None:
    """The same on a TP-2 group of two device processes: each copies its half of the heads
    of the same page ids to its own host tier and back; tokens unchanged."""
    from nitsum.pool.pool_engine import PoolEngine

    hf, cfg = tiny
    ecfg = EngineConfig(
        page_tokens=P,
        token_budget=64,
        max_batch=2,
        tp_levels=(1, 2),
        host_kv_cache_bytes=kv_bytes(cfg, 32),
        prefix_caching=False,
    )
    ps = {r: prompt(cfg, 30 + i, seed=i) for i, r in enumerate(("bg0", "bg1", "strict"))}
    with tiny_device_pool(tiny, ecfg, devices=2, pages=64, levels=(1, 2)) as pool:
        pe = PoolEngine(pool, cfg, ecfg, 64, [tp(0, 1)])
        pe.engines[tp(0, 1)].scheduler.swap.bytes_per_s = 1e15
        out: dict[str, list[int]] = {}
        peak = {"kv_cache_usage_perc": 0, "host_kv_usage_perc": 0}
        for step in range(200):
            if step == 0:
                for r in ("bg0", "bg1"):
                    pe.add_request(r, ps[r], RequestSpec(LONG, slo_class="background", tier="b"))
            if step == 6:
                pe.add_request(
                    "strict", ps["strict"], RequestSpec(LONG, slo_class="feasible", tier="s")
                )
            if step > 6 and not pe.has_unfinished():
                break
            for o in pe.step():
                out.setdefault(o.request_id, []).extend(o.new_token_ids)
            peak = {k: max(v, pe.usage()[k]) for k, v in peak.items()}
        c = pe.all_counters()
        for d, (used, owned) in pe.page_accounting().items():
            assert used == owned == set(), d
    for r, p in ps.items():
        assert out[r] == hf_greedy(hf, p, 24), r
    assert c["num_preemptions_swap"] == 1
    # At TP 2 a page holds 8 tokens: bg1 had 31 + 5 computed, 5 pages, out and back, and
    # each of the two devices moved its half-head page of the full page size.
    assert (c["swap_out_pages"], c["swap_in_pages"]) == (5, 5)
    assert c["swap_bytes"] == 2 * 10 * kv_bytes(cfg, 1)
    # Usage gauges: bg1's 5 pages held 5 of 32 host pages (16%) while it was swapped out;
    # nothing is held at the end.
    assert peak["host_kv_usage_perc"] == 16 and peak["kv_cache_usage_perc"] > 0, peak
    assert (c["kv_cache_usage_perc"], c["host_kv_usage_perc"]) == (0, 0)
