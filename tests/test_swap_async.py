"""The asynchronous swap manager (issue 13, item 4): copies run on a copy thread in ticket
order, a sequence whose swap-in is in flight waits while the rest of the batch runs, pages
under a copy in flight are never handed to a new owner, and the sync/async choice."""

import threading
import time

import pytest
import torch

from nitsum.engine.build import build_engine
from nitsum.engine.engine_config import EngineConfig
from nitsum.engine.request_spec import RequestSpec
from nitsum.engine.swap import SwapSpace
from nitsum.kv.cache import KVCache
from nitsum.kv.host_tier import HostKVTier
from nitsum.kv.pages import PageAllocator
from nitsum.kv.swap_copier import SwapCopier, SwapProgress
from nitsum.sampling import SamplingParams
from tiny import hf_greedy, kv_bytes, make_tiny
from tiny import random_prompt as prompt

P = 4


@pytest.fixture(scope="module")
def tiny():
    return make_tiny("llama-gqa")


def test_copier_runs_tickets_in_order_off_the_caller(tiny) -> None:
    """Ticket 2 reads the host page ticket 1 writes: FIFO order makes it see ticket 1's data,
    though neither call waited; a ticket not above the earlier ones is refused."""
    _, cfg = tiny
    pool = KVCache(cfg, 16, P)
    pool.storage.normal_()
    before = pool.storage.clone()
    copier = SwapCopier(HostKVTier(pool, 4))
    try:
        copier.start(1, [(5, 0), (6, 1)], [])
        copier.start(2, [], [(0, 9), (1, 10)])
        with pytest.raises(ValueError):
            copier.start(2, [], [])
        done = copier.progress(wait_for=2)
        assert done.done_through == 2 and done.copies == 2
        assert done.bytes == 4 * pool.bytes_per_page
        assert torch.equal(pool.storage[:, :, 9:11], before[:, :, 5:7])
        assert copier.progress() == SwapProgress(2, 0, 0, 0.0)  # reported once
    finally:
        copier.close()


class FakeCopier:
    """Records starts; a ticket is done only when the test (or a wait) says so."""

    def __init__(self) -> None:
        self.started: list[int] = []
        self.done = 0
        self.waited: list[int] = []

    def start_swap(self, ticket: int, out: list, into: list) -> None:
        self.started.append(ticket)

    def swap_progress(self, wait_for: int | None = None) -> SwapProgress:
        if wait_for is not None:
            self.waited.append(wait_for)
            self.done = max(self.done, wait_for)
        return SwapProgress(self.done)


def test_pages_under_a_copy_in_flight_go_to_nobody_until_it_is_done() -> None:
    """A swapped-out sequence's pages are released at once but held: allocations take other
    pages while any are free, and wait for the copy (settle) when only held ones are left."""
    device = PageAllocator(1, 8, P, 1).group((0,), 1)
    swap = SwapSpace(PageAllocator(1, 8, P, 1).group((0,), 1), device, page_bytes=1)
    swap.copier = copier = FakeCopier()
    victim = device.allocate(4)
    assert victim == [0, 1, 2, 3]
    swap.swap_out(victim)
    device.release(victim)
    swap.submit()
    assert len(copier.started) == 1 and swap.inflight
    assert device.num_free == 8
    assert device.allocate(4) == [4, 5, 6, 7]  # not the held ones
    assert copier.waited == []
    got = device.allocate(2)  # only held pages are free: wait for the copy first
    assert copier.waited == [copier.started[0]] and set(got) <= set(victim)
    assert not swap.inflight and (device.alloc.held == 0).all()


def test_sync_or_async_swap_in_by_cost() -> None:
    device = PageAllocator(1, 8, P, 1).group((0,), 1)
    swap = SwapSpace(PageAllocator(1, 8, P, 1).group((0,), 1), device, page_bytes=1000)
    swap.bytes_per_s = 1e6  # one page: 1 ms
    assert swap.sync_is_cheaper(pages=10, others=0, step_s=0.05)  # nobody else waits
    assert swap.sync_is_cheaper(pages=10, others=4, step_s=0.05)  # 40 ms of others' time
    assert not swap.sync_is_cheaper(pages=10, others=8, step_s=0.05)  # 80 ms: async
    assert swap.sync_is_cheaper(pages=1, others=32, step_s=0.05)  # many short: sync
    swap.mode = "async"
    assert not swap.sync_is_cheaper(pages=1, others=0, step_s=0.05)


def gated(engine) -> threading.Event:
    """Make the engine's copy thread hold every swap-in until the returned event is set."""
    host = engine.runner.copier.host
    gate = threading.Event()
    plain = host.swap

    def swap(out, into):
        if into:
            assert gate.wait(30), "the test never opened the gate"
        return plain(out, into)

    host.swap = swap
    return gate


SHORT = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
LONG = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)


class Loading:
    """An engine (batch of 2) where background bg1 was swapped out for a strict request and
    is now swapping back in asynchronously, its copy held up by a gate; bg0 runs on."""

    def __init__(self, tiny) -> None:
        hf, cfg = tiny
        ecfg = EngineConfig(
            kv_cache_bytes=kv_bytes(cfg, 64),
            host_kv_cache_bytes=kv_bytes(cfg, 32),
            page_tokens=P,
            token_budget=64,
            max_batch=2,
            prefix_caching=False,
        )
        self.engine = engine = build_engine(cfg, hf.state_dict().items(), ecfg)
        self.s = s = engine.scheduler
        s.swap.bytes_per_s, s.swap.mode = 1e15, "async"  # always swap, always asynchronously
        self.gate = gated(engine)
        self.ps = {r: prompt(cfg, 30 + i, seed=i) for i, r in enumerate(("bg0", "bg1", "strict"))}
        self.out: dict[str, list[int]] = {}
        engine.add_request(
            "bg0", self.ps["bg0"], RequestSpec(LONG, slo_class="background", tier="b")
        )
        engine.add_request(
            "bg1", self.ps["bg1"], RequestSpec(SHORT, slo_class="background", tier="b")
        )
        for _ in range(4):
            self.step()
        engine.add_request(
            "strict", self.ps["strict"], RequestSpec(SHORT, slo_class="feasible", tier="s")
        )
        self.step()
        assert s.swapped == 1 and engine.seqs["bg1"].host_pages
        while not engine.seqs["bg1"].loading:
            self.step()

    def step(self) -> None:
        for o in self.engine.step():
            self.out.setdefault(o.request_id, []).extend(o.new_token_ids)

    def finish(self) -> None:
        """Step to the end; every page is back in its pool and nothing is held."""
        while self.engine.has_unfinished():
            self.step()
        s = self.s
        assert s.num_reclaimable() == s.pages.num_pages
        assert s.swap.host.num_free == s.swap.host.num_pages
        assert (s.pages.alloc.held == 0).all() and not s.swap.inflight
        self.engine.runner.copier.close()


def test_a_loading_sequence_waits_while_the_batch_runs(tiny) -> None:
    """While bg1's copy back is held up, bg0 keeps decoding and bg1 gets nothing. Once the
    copy is done bg1 resumes, and every request ends with the reference tokens."""
    hf, _ = tiny
    t = Loading(tiny)
    held = (len(t.out["bg0"]), len(t.out.get("bg1", [])))
    for _ in range(5):
        t.step()  # the copy cannot finish: bg0 runs alone
    assert t.engine.seqs["bg1"].loading
    assert len(t.out["bg0"]) == held[0] + 5 and len(t.out.get("bg1", [])) == held[1]
    t.gate.set()
    t.finish()
    assert t.out["bg0"] == hf_greedy(hf, t.ps["bg0"], 64)
    for r in ("bg1", "strict"):
        assert t.out[r] == hf_greedy(hf, t.ps[r], 16), r
    assert t.engine.counters()["swap_in_pages"] == t.engine.counters()["swap_out_pages"]


def test_abort_while_loading_waits_for_the_copy(tiny) -> None:
    """Aborting bg1 mid-copy waits for the copy into its pages before they are freed; the
    others finish unchanged."""
    hf, _ = tiny
    t = Loading(tiny)
    threading.Timer(0.3, t.gate.set).start()
    t0 = time.monotonic()
    assert t.engine.abort("bg1")
    assert time.monotonic() - t0 >= 0.25
    t.finish()
    assert "bg1" not in t.engine.seqs
    assert t.out["bg0"] == hf_greedy(hf, t.ps["bg0"], 64)
    assert t.out["strict"] == hf_greedy(hf, t.ps["strict"], 16)


def test_a_copy_out_of_a_page_being_copied_into_goes_in_the_next_ticket() -> None:
    """Within a ticket copies out run first: swapping out (or demoting) a page the planned
    ticket copies into starts that ticket first, so the copy out reads the loaded data."""
    from nitsum.engine.sequence import Sequence

    device = PageAllocator(1, 8, P, 1).group((0,), 1)
    swap = SwapSpace(PageAllocator(1, 8, P, 1).group((0,), 1), device, page_bytes=1)
    swap.copier = copier = FakeCopier()
    seq = Sequence("s", [1, 2, 3], RequestSpec(SamplingParams()))
    pages = device.allocate(2)
    swap.swap_in(seq, [5, 6], pages, sync=False)
    assert copier.started == [] and seq.loading
    swap.swap_out(pages[1:])  # preempted again in the same pass
    assert len(copier.started) == 1 and swap.out == [(pages[1], swap.out[0][1])]
    swap.submit()
    assert len(copier.started) == 2 and copier.started[0] < copier.started[1]
