"""Idle cached pages move to the host tier ahead of need, and an overlapped engine's
allocations never wait for those copies (engine/kv_space.py, `reclaim` / `write_back`).

The 2026-11-27 H200 run: with a 30 GB pool full of cached prefixes, every admission moved
the pages it needed to host and then waited for those copies, which ran after the step in
flight: the host stopped once per admission and the bursty load took 66 s for 40 s."""

from __future__ import annotations

import pytest

from nitsum.engine.build import build_engine
from nitsum.engine.engine_config import EngineConfig
from nitsum.engine.request_spec import RequestSpec
from nitsum.kv.pages import GroupPages
from nitsum.sampling import SamplingParams
from tiny import kv_bytes, make_tiny, random_prompt

P = 4  # tokens per page
PARAMS = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)


def engine_for(overlap: bool, caching: bool = True, host_pages: int = 16):
    hf, cfg = make_tiny("llama-gqa")
    ecfg = EngineConfig(
        kv_cache_bytes=kv_bytes(cfg, 64),
        host_kv_cache_bytes=kv_bytes(cfg, host_pages),
        page_tokens=P,
        token_budget=32,
        prefix_caching=caching,
        overlap=overlap,
    )
    return build_engine(cfg, hf.state_dict().items(), ecfg), cfg


def serve_all(engine, prompts: list[list[int]]) -> dict[str, list[int]]:
    """Requests arriving two at a time while others run; every request's tokens."""
    out: dict[str, list[int]] = {}
    pending = list(enumerate(prompts))
    while pending or engine.has_unfinished():
        for i, p in pending[:2]:
            engine.add_request(f"r{i}", p, RequestSpec(PARAMS))
        pending = pending[2:]
        for o in engine.step():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
        for _ in range(3):
            if engine.has_unfinished():
                for o in engine.step():
                    out.setdefault(o.request_id, []).extend(o.new_token_ids)
    return out


@pytest.mark.parametrize("overlap", [False, True])
def test_a_pool_full_of_cached_pages_admits_without_waiting_for_copies(monkeypatch, overlap):
    """24 distinct 30-token prompts through a 64-page pool (8 pages each): the pool fills with
    cached pages. Overlapped, no allocation ever waits for a copy to host (`settle`), and
    pages still moved there ahead of need; synchronous, moving on demand is allowed. Tokens
    equal an engine's without the cache either way."""
    waits = 0
    settle = GroupPages.allocate

    def counted(self: GroupPages, n: int, after: int | None = None) -> list[int]:
        nonlocal waits
        inner = self.settle

        def counting() -> None:
            nonlocal waits
            waits += 1
            assert inner is not None
            inner()

        self.settle = counting if inner is not None else None
        try:
            return settle(self, n, after)
        finally:
            self.settle = inner

    engine, cfg = engine_for(overlap)
    assert engine.scheduler.kv.demote_on_demand is not overlap
    prompts = [random_prompt(cfg, 30, seed=100 + i) for i in range(24)]
    monkeypatch.setattr(GroupPages, "allocate", counted)
    out = serve_all(engine, prompts)
    monkeypatch.undo()
    ref, _ = engine_for(overlap=False, caching=False)
    assert out == serve_all(ref, prompts)
    assert all(len(t) == 4 for t in out.values()) and len(out) == 24
    swap = engine.scheduler.swap
    assert swap is not None and swap.counters["swap_out_pages"] > 0
    if overlap:
        assert waits == 0


def test_write_back_keeps_pages_free_ahead_of_need() -> None:
    """After a step, the scheduler has moved least recently used idle cached pages to host
    until `ahead` pages are free (bounded by a quarter of the host tier per step)."""
    engine, cfg = engine_for(overlap=False, host_pages=64)
    kv = engine.scheduler.kv
    kv.ahead = 6
    # Fill the pool with cached pages: 7 prompts of 30 tokens (7 full pages each: 49 of 64).
    for i in range(7):
        engine.add_request(f"f{i}", random_prompt(cfg, 30, seed=i), RequestSpec(PARAMS))
    while engine.has_unfinished():
        engine.step()
    cache = engine.scheduler.cache
    assert cache is not None and cache.num_host == 0
    free_before = engine.pages.num_free
    assert free_before >= kv.ahead  # nothing to do yet
    # One more 30-token prompt takes 8 pages: fewer than `ahead` stay free, the rest move.
    engine.add_request("g", random_prompt(cfg, 30, seed=99), RequestSpec(PARAMS))
    engine.step()
    assert free_before - 8 < kv.ahead
    assert engine.pages.num_free >= kv.ahead
    moved = cache.num_host
    assert moved == kv.ahead - (free_before - 8)
    assert engine.scheduler.swap.counters["swap_out_pages"] == moved


def test_ready_pages_are_counted_without_a_pass_unless_holds_decide(monkeypatch) -> None:
    """`ready_at_least` answers from the free count while the holds in force cannot change
    the answer, and passes over the pool only when they can (and is right both ways)."""
    from nitsum.kv.pages import PageAllocator

    group = PageAllocator(1, 32, 4, 2).group((0,), 1)
    group.allocate(20)  # 12 free
    group.hold([25, 26, 27])  # 3 of them held: 9 ready
    passes = 0
    mask = GroupPages._held_mask

    def counted(self: GroupPages):
        nonlocal passes
        passes += 1
        return mask(self)

    monkeypatch.setattr(GroupPages, "_held_mask", counted)
    assert group.ready_at_least(9) and passes == 0  # 12 free less 3 holds
    assert not group.ready_at_least(13) and passes == 0  # more than free
    assert not group.ready_at_least(10) and passes == 1  # the holds decide: 9 ready
    group.unhold([25, 26, 27])
    assert group.ready_at_least(12) and passes == 1


@pytest.mark.parametrize("others", [0, 1])
def test_a_match_loading_from_host_never_evicts_its_own_next_pages(others: int) -> None:
    """A 3-page prefix on a full host tier: each load makes room on host for a device page
    (as `reclaim` does), and that room comes from other host entries, never from the pages
    this match loads next; with no other entry there is no room (the device page drops)."""
    from nitsum.kv.prefix_cache import PrefixCache

    c = PrefixCache(P)
    chain = list(range(13))  # 3 full pages
    assert c.release([10, 11, 12], chain, computed=12) == []
    if others:
        assert c.release([20], [90 + i for i in range(5)], computed=4) == []
    hosts = iter(range(100))
    c.evict(len(c.idle), lambda page: next(hosts))
    assert c.num_evictable == 0 and c.num_host == 3 + others
    freed: list[list[int]] = []
    devices = iter(range(40, 50))

    def load(host_page: int) -> int:
        freed.append(c.evict_host(1))  # room for a device page moving to host
        return next(devices)

    assert c.match([*chain, 99], load) == [40, 41, 42]
    assert freed == ([[3], [], []] if others else [[], [], []])


def test_write_back_leaves_droppable_pages_so_an_overlapped_admission_never_waits() -> None:
    """A pool of 12 running pages and 4 idle cached ones, copies that finish only when
    waited for (queued behind the step in flight): write-back keeps `ahead` idle pages on
    the device, so the next admission drops them instead of waiting for a copy."""
    from types import SimpleNamespace

    from nitsum.engine.kv_space import KVSpace
    from nitsum.engine.swap import SwapSpace
    from nitsum.kv.pages import PageAllocator
    from nitsum.kv.prefix_cache import PrefixCache
    from nitsum.kv.swap_copier import SwapProgress

    class SlowCopier:
        def __init__(self) -> None:
            self.done = self.waits = 0

        def start_swap(self, ticket: int, out: list, into: list) -> None:
            pass

        def swap_progress(self, wait_for: int | None = None) -> SwapProgress:
            if wait_for is not None:
                self.waits += 1
                self.done = max(self.done, wait_for)
            return SwapProgress(done_through=self.done)

    dev = PageAllocator(1, 16, P, 2).group((0,), 1)
    swap = SwapSpace(PageAllocator(1, 16, P, 2).group((0,), 1), dev, 1 << 20)
    copier = SlowCopier()
    swap.copier = copier
    cache = PrefixCache(P)
    kv = KVSpace(dev, cache, swap, step_tokens=16)
    kv.demote_on_demand = False  # as enable_overlap sets it
    assert kv.ahead == 4
    dev.allocate(12)
    dev.release(cache.release(dev.allocate(4), list(range(17)), computed=16))
    kv.write_back()
    swap.submit()
    assert cache.num_evictable == 4 and dev.alloc.holds == 0
    swap.poll()
    seq = SimpleNamespace(pages=[])
    assert kv.allocate(seq, 16) and len(seq.pages) == 4  # type: ignore[arg-type]
    assert copier.waits == 0
