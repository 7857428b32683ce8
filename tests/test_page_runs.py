"""Coarse page groups (issue 13, item 3): pages are handed out in few runs of consecutive
ids, a growing sequence extends its own run, and freed runs merge back."""

import random

import numpy as np

from nitsum.kv.host_tier import runs
from nitsum.kv.pages import PageAllocator, free_runs, page_runs


def test_page_runs_best_fit_then_largest_first() -> None:
    free = np.array([1, 1, 0, 1, 1, 1, 1, 0, 1, 1, 1, 0], dtype=bool)
    assert free_runs(free) == [(0, 2), (3, 4), (8, 3)]
    assert page_runs(free, 3) == [8, 9, 10]  # the smallest run that holds 3
    assert page_runs(free, 2) == [0, 1]
    assert page_runs(free, 6) == [3, 4, 5, 6, 8, 9]  # no run holds 6: largest runs first
    assert page_runs(free, 2, after=2) == [3, 4]  # right after the sequence's last page
    assert page_runs(free, 6, after=7) == [8, 9, 10, 3, 4, 5]
    assert page_runs(free, 20) == [3, 4, 5, 6, 8, 9, 10, 0, 1]  # all there is


def test_random_allocations_stay_consistent_and_merge_back() -> None:
    """Property test: sequences arrive (1-12 pages), grow a page at a time and leave in
    random order on a nearly full pool. No page is handed out twice, the free count stays
    exact, a sequence holds few runs (about 1.6 on average; 2.8 when every allocation takes
    the lowest free ids), and once all is freed the pool is one run again."""
    rng = random.Random(0)
    alloc = PageAllocator(2, 256, 4, 4)
    group = alloc.group((0, 1), 2)
    held: list[list[int]] = []
    mean_runs = []
    for i in range(3000):
        if held and (rng.random() < 0.3 or group.num_free < 24):
            group.release(held.pop(rng.randrange(len(held))))
        elif held and rng.random() < 0.6:
            seq = held[rng.randrange(len(held))]
            seq += group.allocate(1, seq[-1])
        else:
            n = rng.randint(1, 12)
            held.append(group.allocate(n))
            assert len(held[-1]) == n
        owned = [p for h in held for p in h]
        assert len(owned) == len(set(owned)), "a page handed out twice"
        assert group.num_free == 256 - len(owned)
        assert set(np.flatnonzero(~alloc.free[0]).tolist()) == set(owned)
        if i % 50 == 0 and held:
            mean_runs.append(np.mean([len(runs(h, h)) for h in held]))
    assert np.mean(mean_runs) < 2.0, np.mean(mean_runs)
    for h in held:
        group.release(h)
    assert free_runs(group._free_mask()) == [(0, 256)]
