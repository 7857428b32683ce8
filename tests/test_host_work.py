"""The host's work per step stays proportional to the step's rows (issue 28: the host must
hide behind the GPU's step; scripts/bench_host.py times it). These tests count work, not
time: membership tests by identity, a pool's free count without a pass over every page, a
decode row's slot and tokens without copies of its context."""

import random

import numpy as np
import torch

from nitsum.engine.build import build_engine
from nitsum.engine.engine_config import EngineConfig
from nitsum.engine.request_spec import RequestSpec
from nitsum.engine.sequence import Sequence
from nitsum.engine.step_inputs import page_table
from nitsum.kv.pages import GroupPages, PageAllocator
from nitsum.sampling import SamplingParams
from tiny import kv_bytes, make_tiny, random_prompt


def test_sequences_are_equal_only_to_themselves() -> None:
    a, b = Sequence("r", [1, 2, 3]), Sequence("r", [1, 2, 3])
    assert a != b and a == a
    queue = [a]
    assert b not in queue and a in queue
    assert len({a, b}) == 2  # hashable by identity


def test_token_slice_within_across_and_after_the_prompt() -> None:
    seq = Sequence("r", [10, 11, 12], output_ids=[20, 21])
    whole = seq.prompt_ids + seq.output_ids
    for start in range(len(whole)):
        for n in range(1, len(whole) - start + 1):
            assert seq.token_slice(start, n) == whole[start : start + n], (start, n)


def test_page_table_pads_each_row() -> None:
    rows = [[5, 6, 7], [], [9], [1, 2, 3, 4]]
    want = torch.tensor([[5, 6, 7, 0], [0, 0, 0, 0], [9, 0, 0, 0], [1, 2, 3, 4]])
    assert torch.equal(page_table(rows), want)
    assert page_table([]).shape == (0, 0)


def test_free_counts_of_groups_sharing_devices_stay_exact() -> None:
    """Property test: two groups over device 0 (a TP-2 group of devices 0-1 and a TP-1 group
    of device 0, as a switch's old and new layouts) allocate, grow and release at random;
    each one's cached free count equals a full count of its pages free on all members."""
    rng = random.Random(1)
    alloc = PageAllocator(2, 128, 4, 4)
    groups = [alloc.group((0, 1), 2), alloc.group((0,), 1)]
    held: list[tuple[GroupPages, list[int]]] = []
    for _ in range(2000):
        group = rng.choice(groups)
        if held and rng.random() < 0.35:
            owner, pages = held.pop(rng.randrange(len(held)))
            owner.release(pages)
        elif held and rng.random() < 0.5:
            owner, pages = held[rng.randrange(len(held))]
            if owner.num_free:
                pages += owner.allocate(1, pages[-1])
        elif group.num_free >= 4:
            held.append((group, group.allocate(rng.randint(1, 4))))
        for g in groups:
            assert g.num_free == int(alloc.free[g.members].all(axis=0).sum())


def test_a_release_naming_a_page_twice_counts_it_once() -> None:
    alloc = PageAllocator(1, 8, 4, 4)
    group = alloc.group((0,), 1)
    pages = group.allocate(3)
    assert group.num_free == 5
    group.release([pages[0], pages[0], pages[1]])
    group.release([pages[1]])  # already free
    assert group.num_free == 7 == int(alloc.free[0].sum())


def test_a_growing_sequence_takes_the_pages_after_its_last() -> None:
    """The quick path (the next pages free) and the full one (taken: best fit elsewhere)."""
    alloc = PageAllocator(1, 16, 4, 4)
    group = alloc.group((0,), 1)
    assert group.allocate(2) == [0, 1]
    assert group.allocate(3, after=1) == [2, 3, 4]
    assert group.allocate(1) == [5]
    assert group.allocate(2, after=4) == [6, 7]  # page 5 is taken: the free run after it
    assert group.num_free == 8 and not alloc.free[0][:8].any()


def test_a_decode_step_does_not_pass_over_the_pool_per_row(monkeypatch) -> None:
    """48 sequences decode with 4-token pages (a new page every 4 steps each): the steps ask
    for free pages once per row, and a full pass over the pool's pages happens once per
    page handed out plus a few per step, not twice per row and step as it did."""
    hf, cfg = make_tiny("llama-gqa")
    ecfg = EngineConfig(kv_cache_bytes=kv_bytes(cfg, 1024), page_tokens=4, max_batch=64)
    engine = build_engine(cfg, hf.state_dict().items(), ecfg)
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    for i in range(48):
        engine.add_request(f"r{i}", random_prompt(cfg, 6, i), RequestSpec(params))
    while any(not s.prefilled for s in engine.seqs.values()):
        engine.step()
    passes = 0
    full = GroupPages._free_mask

    def counted(self: GroupPages) -> np.ndarray:
        nonlocal passes
        passes += 1
        return full(self)

    monkeypatch.setattr(GroupPages, "_free_mask", counted)
    steps = 12
    pages_before = sum(len(s.pages) for s in engine.seqs.values())
    for _ in range(steps):
        engine.step()
    assert len(engine.seqs) == 48  # all still decoding
    # NOTE: a row whose next page is taken finds a free run elsewhere: one pass per new page.
    new_pages = sum(len(s.pages) for s in engine.seqs.values()) - pages_before
    assert 0 < new_pages < 48 * steps // 2
    assert passes <= new_pages + 2 * steps, (passes, new_pages)
