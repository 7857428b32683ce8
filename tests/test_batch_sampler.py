"""The batched sampler (sampling.py): every row's distribution equals the per-row rules,
a batch samples in the same few ops whatever its size, and a seeded row repeats exactly
whatever it is batched with."""

import random

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from nitsum.sampling import (
    SAMPLE_FAILED,
    SamplingParams,
    batch_probs,
    draw,
    sample,
    sample_on_device,
)


def row_probs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """The reference: one row, vLLM's order (temperature, top-k, softmax, min-p, top-p)."""
    row = logits.double() / p.temperature
    if p.top_k > 0:
        kth = torch.topk(row, min(p.top_k, row.numel())).values[-1]
        row = row.masked_fill(row < kth, float("-inf"))
    probs = torch.softmax(row, dim=-1)
    if p.min_p > 0:
        probs = probs.masked_fill(probs < p.min_p * probs.max(), 0.0)
    if p.top_p < 1:
        sorted_p, idx = probs.sort(descending=True)
        drop = sorted_p.cumsum(0) - sorted_p >= p.top_p
        probs = torch.zeros_like(probs).scatter_(0, idx, sorted_p.masked_fill(drop, 0.0))
    return probs


def random_params(rng: random.Random, vocab: int) -> SamplingParams:
    return SamplingParams(
        temperature=rng.choice([0.3, 0.7, 1.0, 1.5]),
        top_k=rng.choice([-1, 0, 1, 3, 17, vocab, vocab + 50]),
        top_p=rng.choice([1.0, 1.0, 0.9, 0.5, 0.05]),
        min_p=rng.choice([0.0, 0.0, 0.05, 0.2]),
    )


def test_each_row_of_a_mixed_batch_follows_its_own_rules() -> None:
    rng = random.Random(0)
    vocab = 97
    torch.manual_seed(0)
    logits = torch.randn(48, vocab) * 3
    params = [random_params(rng, vocab) for _ in range(48)]
    got = batch_probs(logits, params)
    for i, p in enumerate(params):
        want = row_probs(logits[i], p)
        assert torch.equal(got[i] > 0, want > 0), (i, p)  # the same tokens survive
        torch.testing.assert_close(got[i].double(), want, atol=1e-6, rtol=1e-4)


class OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops += 1
        return func(*args, **(kwargs or {}))


def test_a_batch_samples_in_the_same_ops_whatever_its_size() -> None:
    """The device sampler's op count does not grow with the rows (it was ~8 per random row:
    500 launches a step at batch 64 on a GPU)."""
    p = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, min_p=0.01)
    counts = []
    for rows in (2, 64):
        with OpCounter() as counter:
            sample_on_device(torch.randn(rows, 50), [p] * rows)
        counts.append(counter.ops)
    assert counts[0] == counts[1] < 60, counts  # ATen ops, views included


def test_mixed_greedy_random_and_broken_rows() -> None:
    logits = torch.full((5, 8), -20.0)
    logits[:, 3] = 5.0
    logits[2] = float("nan")
    params = [
        SamplingParams(temperature=0),
        SamplingParams(temperature=1.0, top_k=1),
        SamplingParams(temperature=0.9),
        SamplingParams(temperature=0),
        SamplingParams(temperature=0.5, top_p=0.1),
    ]
    assert sample_on_device(logits, params).tolist() == [3, 3, SAMPLE_FAILED, 3, 3]
    assert sample(logits, params, [None] * 5) == [3, 3, SAMPLE_FAILED, 3, 3]


def test_a_seeded_row_repeats_whatever_it_is_batched_with() -> None:
    torch.manual_seed(1)
    logits = torch.randn(6, 300)
    seeded = SamplingParams(temperature=1.0, top_p=0.95, seed=7)
    others = [SamplingParams(temperature=1.0)] * 5

    def draw(row: int, batch: int) -> int:
        params = others[: batch - 1]
        params.insert(row, seeded)
        gens: list[torch.Generator | None] = [None] * len(params)
        gens[row] = torch.Generator().manual_seed(7)
        return sample(logits[:batch], params, gens)[row]

    alone = sample(logits[:1], [seeded], [torch.Generator().manual_seed(7)])[0]
    reference = int(
        torch.multinomial(
            row_probs(logits[0], seeded).float(), 1, generator=torch.Generator().manual_seed(7)
        )
    )
    assert alone == reference
    assert draw(0, 6) == alone and draw(0, 3) == alone


def test_draws_follow_the_distribution_and_never_pick_a_zero() -> None:
    torch.manual_seed(3)
    probs = torch.tensor([0.0, 0.2, 0.0, 0.8, 0.0]).repeat(4000, 1)
    counts = torch.bincount(draw(probs), minlength=5).tolist()
    assert counts[0] == counts[2] == counts[4] == 0
    assert 700 < counts[1] < 900, counts  # 800 expected, sd 25
    edges = torch.zeros(2000, 6)
    edges[::2, 0] = 1.0  # all the mass on the first token, then on the last
    edges[1::2, 5] = 3.0  # (rows need not sum to 1)
    assert draw(edges).tolist() == [0, 5] * 1000
