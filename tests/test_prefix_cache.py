"""Prefix reuse across turns (issue 13, item 5): the cache's bookkeeping, then the engine on a
tiny model: a second turn computes only its new tokens and answers exactly as a cold run; a
prefix partly evicted is partly reused; a preempted sequence recomputes only what it lost."""

import pytest

from nitsum.engine.build import build_engine
from nitsum.engine.engine_config import EngineConfig
from nitsum.engine.request_spec import RequestSpec
from nitsum.kv.prefix_cache import PrefixCache
from nitsum.sampling import SamplingParams
from shapes import tp
from tiny import kv_bytes, make_tiny
from tiny import random_prompt as history

GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
P = 4  # tokens per page


def test_a_cache_salt_isolates_prefixes() -> None:
    """vLLM's cache_salt: pages released under one salt are found only under that salt."""
    c = PrefixCache(P)
    tokens = list(range(9))
    assert c.release([1, 2, 3], tokens, computed=9, salt="a") == [3]
    assert c.match(tokens) == []  # unsalted
    assert c.match(tokens, salt="b") == []
    assert c.match(tokens, salt="a") == [1, 2]
    assert c.publish([5, 6], tokens, computed=8) == 8  # the unsalted copy is its own
    assert c.match(tokens) == [5, 6]


def test_match_release_evict() -> None:
    c = PrefixCache(P)
    tokens = list(range(14))  # pages [0..3] [4..7] [8..11], 2 tokens on a partial page
    # Nothing cached: a sequence that computed 13 tokens on pages 10, 11, 12, 13 releases
    # them: its 3 full pages are kept, the partial one is freed.
    assert c.match(tokens) == []
    assert c.release([10, 11, 12, 13], tokens, computed=13) == [13]
    assert (len(c), c.num_evictable, c.pages()) == (3, 3, {10, 11, 12})
    # The same prefix again: all 3 pages, but at least one token is left to compute.
    assert c.match(tokens) == [10, 11, 12]
    assert c.match(tokens[:12]) == [10, 11]  # 12 tokens: the last page must be computed
    assert c.match([0, 1, 2, 3, 9, 9, 9, 9, 9]) == [10]  # diverges in page 2
    assert c.num_evictable == 0  # all referenced
    assert (c.queries, c.hits) == (14 + 14 + 12 + 9, 0 + 12 + 8 + 4)
    # Releasing the users makes them idle again; a duplicate full page is freed, not kept.
    assert c.release([10, 11, 12], tokens, computed=12) == []
    assert c.release([10, 11], tokens[:12], computed=11) == []
    assert c.release([10, 20, 21], [0, 1, 2, 3] + [9] * 5, computed=8) == [21]
    assert (len(c), c.num_evictable) == (4, 4)  # 10, 11, 12 and 20 (the [9,9,9,9] branch)
    c.release(c.match(tokens), tokens, computed=13)  # the deep chain is the most recent
    # Eviction: least recently used first and, within a chain, the deepest page first.
    assert c.evict(1) == [20]
    assert c.evict(1) == [12]
    assert c.match(tokens) == [10, 11]
    assert c.clear() == []  # referenced pages stay
    c.release([10, 11], tokens, computed=8)
    assert sorted(c.clear()) == [10, 11] and len(c) == 0


@pytest.fixture(scope="module")
def tiny():
    return make_tiny("llama-gqa")


def engine_for(tiny, caching: bool = True, kv: int = 1 << 20, **kw):
    hf, cfg = tiny
    ecfg = EngineConfig(
        kv_cache_bytes=kv, page_tokens=P, token_budget=64, prefix_caching=caching, **kw
    )
    return build_engine(cfg, hf.state_dict().items(), ecfg)


def serve(engine, rid: str, prompt: list[int], params=GREEDY) -> tuple[list[int], int]:
    """Run one request to the end: its tokens and the prompt tokens computed for it."""
    engine.add_request(rid, prompt, RequestSpec(params))
    out: list[int] = []
    computed = 0
    while engine.has_unfinished():
        batch = engine.begin_step()
        computed += sum(s.q_len for s in batch if s.seq.request_id == rid and s.start < len(prompt))
        for o in engine.end_step(batch, engine.runner.run(batch), 0.0):
            out += o.new_token_ids
    return out, computed


def test_a_second_turn_computes_only_its_new_tokens(tiny) -> None:
    hf, cfg = tiny
    turn1 = history(cfg, 37, seed=1)
    warm, cold = engine_for(tiny), engine_for(tiny, caching=False)
    out1, computed1 = serve(warm, "t1", turn1)
    assert computed1 == 37
    # Turn 2: the whole of turn 1 (prompt and answer) plus a new user message.
    turn2 = turn1 + out1 + history(cfg, 11, seed=2)
    out2, computed2 = serve(warm, "t2", turn2)
    ref2, cold2 = serve(cold, "t2", turn2)
    assert out2 == ref2
    assert cold2 == len(turn2) == 54
    # Turn 1 computed 37 + 5 tokens of KV (its last answer token has none): 10 full pages.
    assert computed2 == len(turn2) - 40 == 14
    cache = warm.scheduler.cache
    assert (cache.queries, cache.hits) == (37 + 54, 40)


def test_a_partly_evicted_prefix_is_partly_reused_and_still_exact(tiny) -> None:
    hf, cfg = tiny
    turn1 = history(cfg, 40, seed=3)
    engine = engine_for(tiny, kv=kv_bytes(cfg, 24))
    assert engine.pages.num_pages == 24
    out1, _ = serve(engine, "t1", turn1)
    # 11 full pages cached. Another request of 60 tokens (15 pages + 1 for its answer) must
    # evict 3 of them, the deepest first.
    serve(engine, "other", history(cfg, 60, seed=4))
    turn2 = turn1 + out1 + history(cfg, 6, seed=5)
    out2, computed = serve(engine, "t2", turn2)
    ref2, _ = serve(engine_for(tiny, caching=False), "t2", turn2)
    assert out2 == ref2
    assert 0 < len(turn2) - computed < 44, computed  # some pages reused, not all


def test_a_preempted_sequence_recomputes_only_the_pages_it_lost(tiny) -> None:
    """Recompute preemption keeps the victim's full pages in the cache: when it comes back,
    it prefills only what was overwritten meanwhile; its tokens are unchanged."""
    hf, cfg = tiny
    engine = engine_for(tiny, kv=kv_bytes(cfg, 24), max_batch=2)
    assert engine.pages.num_pages == 24
    long = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    a, b = history(cfg, 40, seed=6), history(cfg, 30, seed=7)
    ref = {
        rid: serve(engine_for(tiny, caching=False), rid, p, long)[0]
        for rid, p in (("a", a), ("b", b))
    }
    engine.add_request("a", a, RequestSpec(long))
    engine.add_request("b", b, RequestSpec(long))
    out: dict[str, list[int]] = {}
    recomputed: dict[str, list[tuple[int, int]]] = {}  # (start, q_len) after its first token
    while engine.has_unfinished():
        batch = engine.begin_step()
        for s in batch:
            if out.get(s.seq.request_id) and s.q_len > 1:
                recomputed.setdefault(s.seq.request_id, []).append((s.start, s.q_len))
        for o in engine.end_step(batch, engine.runner.run(batch), 0.0):
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
    assert out == ref
    # One of them was preempted mid-decode and came back at a page boundary past 0, with
    # fewer tokens to recompute than it had computed.
    assert len(recomputed) == 1, recomputed
    ((start, q_len),) = next(iter(recomputed.values()))
    assert start > 0 and start % P == 0 and q_len < start, (start, q_len)
    assert engine.scheduler.num_reclaimable() == engine.pages.num_pages


@pytest.mark.e2e
def test_kv_moves_into_a_group_evict_its_idle_cached_pages(tiny) -> None:
    """A P/D handoff into a decode group whose pool is full of idle cached pages evicts them
    instead of falling back to recompute; tokens are unchanged."""
    from nitsum.pool.pool_engine import PoolEngine
    from tiny import POOL_DEVICES, hf_greedy, tiny_device_pool

    hf, cfg = tiny
    ecfg = EngineConfig(page_tokens=P, token_budget=64, tp_levels=(1, 2, 4))
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    with tiny_device_pool(tiny) as pool:
        assert pool.num_devices == POOL_DEVICES
        pe = PoolEngine(pool, cfg, ecfg, 24, [tp(d) for d in range(4)])
        # Fill device 1's pool with idle cached pages: three 30-token requests there.
        for i in range(3):
            pe.add_request(
                f"fill{i}",
                history(cfg, 30, seed=10 + i),
                RequestSpec(params),
                group=tp(1),
            )
        while pe.has_unfinished():
            pe.step()
        assert pe.engines[tp(1)].num_evictable() >= 18
        p = history(cfg, 40, seed=20)
        pe.add_request(
            "pd",
            p,
            RequestSpec(params),
            group=tp(0),
            decode_group=tp(1),
        )
        out: list[int] = []
        while pe.has_unfinished():
            out += [t for o in pe.step() for t in o.new_token_ids]
        assert out == hf_greedy(hf, p, 8)
        assert pe.counters["kv_handoff_bytes"] > 0  # its KV moved: not recomputed
        for d, (used, owned) in pe.page_accounting().items():
            assert used == owned, d


def test_pages_evicted_to_the_host_tier_come_back(tiny) -> None:
    """With a host tier, the pages eviction takes from turn 1 move to host instead of being
    dropped: turn 2 loads them back and computes only its new tokens, exactly."""
    hf, cfg = tiny
    turn1 = history(cfg, 40, seed=3)
    engine = engine_for(tiny, kv=kv_bytes(cfg, 24), host_kv_cache_bytes=kv_bytes(cfg, 8))
    cache = engine.scheduler.cache
    out1, _ = serve(engine, "t1", turn1)
    # As in the test above: 11 full pages cached, another request evicts some of them; here
    # they move to host.
    serve(engine, "other", history(cfg, 60, seed=4))
    moved = cache.num_host
    assert moved > 0 and engine.scheduler.swap.counters["swap_out_pages"] == moved
    turn2 = turn1 + out1 + history(cfg, 6, seed=5)
    out2, computed = serve(engine, "t2", turn2)
    ref2, _ = serve(engine_for(tiny, caching=False), "t2", turn2)
    assert out2 == ref2
    # Turn 1 left 40 + 5 tokens of KV: 11 full pages, all reused (44 tokens).
    assert computed == len(turn2) - 44, computed
    assert cache.host_hits >= moved * P
    c = engine.counters()
    assert c["swap_in_pages"] >= moved and c["prefix_cache_host_hits"] == cache.host_hits
    s = engine.scheduler
    assert s.num_reclaimable() == s.pages.num_pages
    assert s.swap.host.num_free + cache.num_host == s.swap.host.num_pages


def test_host_entries_load_evict_and_drop() -> None:
    c = PrefixCache(P)
    tokens = list(range(13))  # 3 full pages
    c.release([10, 11, 12], tokens, computed=12)
    # Evicting two pages (deepest first) moves them to host pages 0 and 1.
    host = iter([0, 1])
    assert c.evict(2, lambda page: next(host)) == [12, 11]
    assert (c.num_evictable, c.num_host, c.pages()) == (1, 2, {10})
    # Without a loader the match stops at the host pages; with one it loads them back.
    assert c.match(tokens) == [10]
    loads: list[int] = []
    # (page 11 went to host page 1, the deeper page 12 to host page 0)
    assert c.match(tokens, lambda h: loads.append(h) or 20 + h) == [10, 21, 20]
    assert loads == [1, 0] and c.num_host == 0 and c.host_hits == 2 * P
    c.release([10, 21, 20], tokens, computed=12)
    c.release([10], tokens, computed=4)
    # Dropping host entries: no room on host (demote gives None) drops the entry.
    assert c.evict(1, lambda page: None) == [20]
    assert c.evict(1, lambda page: 5) == [21] and c.num_host == 1
    assert c.evict_host(3) == [5] and c.num_host == 0
    assert c.match(tokens) == [10]


def first_output(engine, rid: str, prompt: list[int], spec: RequestSpec):
    """Run one request to the end; its first output (which reports `cached_tokens`)."""
    engine.add_request(rid, prompt, spec)
    outs = []
    while engine.has_unfinished():
        batch = engine.begin_step()
        outs += [
            o for o in engine.end_step(batch, engine.runner.run(batch), 0.0) if o.new_token_ids
        ]
    return outs[0]


def test_cached_tokens_are_reported_and_a_salt_shares_only_with_its_own(tiny) -> None:
    hf, cfg = tiny
    prompt = history(cfg, 23, seed=5)
    e = engine_for(tiny)
    assert first_output(e, "a", prompt, RequestSpec(GREEDY)).cached_tokens == 0
    # The same prompt: its 5 full pages (20 tokens; the last page is partial) are hits.
    again = first_output(e, "b", prompt, RequestSpec(GREEDY))
    assert again.cached_tokens == 20
    # Under a salt: nothing shared with the unsalted run, then shared with the same salt.
    salted = RequestSpec(GREEDY, cache_salt="tenant-1")
    assert first_output(e, "c", prompt, salted).cached_tokens == 0
    assert first_output(e, "d", prompt, salted).cached_tokens == 20
    other = RequestSpec(GREEDY, cache_salt="tenant-2")
    assert first_output(e, "e", prompt, other).cached_tokens == 0
    # The answer does not depend on where the KV came from.
    assert first_output(e, "f", prompt, salted).new_token_ids == again.new_token_ids
