"""The logit processors and logprobs against straightforward per-token reference loops
(exact tensors), and the sampler's min_p."""

from __future__ import annotations

import math

import pytest
import torch

from nitsum.errors import InvalidRequestError
from nitsum.sampling import SamplingParams, sample
from nitsum.sampling_logprobs import token_logprobs
from nitsum.sampling_processors import RowContext, apply_processors


def reference(logits: list[float], p: SamplingParams, c: RowContext) -> list[float]:
    """vLLM's semantics, one token at a time: bias, min_tokens, repetition, freq, presence."""
    out = list(logits)
    for t, b in p.logit_bias:
        out[t] += b
    if len(c.output_ids) < p.min_tokens:
        for t in c.end_ids:
            out[t] = -math.inf
    seen = set(c.prompt_ids) | set(c.output_ids)
    for t in range(len(out)):
        if t in seen and p.repetition_penalty != 1.0:
            out[t] = out[t] / p.repetition_penalty if out[t] > 0 else out[t] * p.repetition_penalty
        n = list(c.output_ids).count(t)
        out[t] -= p.frequency_penalty * n + (p.presence_penalty if n else 0.0)
    return out


VOCAB = 12
CASES = [
    (SamplingParams(), RowContext([1, 2], [3])),  # neutral: untouched
    (SamplingParams(presence_penalty=0.5), RowContext([1], [3, 3, 4])),
    (SamplingParams(frequency_penalty=1.5), RowContext([1], [3, 3, 4, 3])),
    (SamplingParams(repetition_penalty=1.3), RowContext([0, 5, 6], [7, 7])),
    (SamplingParams(repetition_penalty=0.8, presence_penalty=-1.0), RowContext([2], [2, 9])),
    (SamplingParams(logit_bias=((4, 100.0), (5, -7.5))), RowContext([1], [])),
    (SamplingParams(min_tokens=3), RowContext([1], [2, 3], end_ids=(0, 11))),
    (SamplingParams(min_tokens=2), RowContext([1], [2, 3], end_ids=(0, 11))),  # reached
]


def test_processors_match_the_reference_row_by_row_in_one_batch() -> None:
    torch.manual_seed(0)
    logits = torch.randn(len(CASES), VOCAB)
    params = [p for p, _ in CASES]
    ctx = [c for _, c in CASES]
    got = apply_processors(logits, params, ctx)
    want = torch.tensor([reference(logits[i].tolist(), p, c) for i, (p, c) in enumerate(CASES)])
    assert torch.equal(got, want.to(got.dtype)) or torch.allclose(got, want, atol=1e-6)
    assert torch.equal(got[0], logits[0])  # a neutral row is exactly its input
    assert got[6, 0] == -math.inf and got[6, 11] == -math.inf  # EOS masked before min_tokens
    assert torch.equal(got[7], logits[7])  # min_tokens reached: nothing masked
    assert int(got[5].argmax()) == 4  # +100 bias wins


def test_no_row_asking_returns_the_input_itself() -> None:
    logits = torch.randn(2, VOCAB)
    out = apply_processors(logits, [SamplingParams()] * 2, [RowContext([1], [])] * 2)
    assert out is logits


def test_penalties_change_the_greedy_pick_as_predicted() -> None:
    logits = torch.zeros(1, VOCAB)
    logits[0, 3], logits[0, 4] = 2.0, 1.5
    p = SamplingParams(temperature=0, frequency_penalty=1.0)
    ctx = [RowContext([1], [3])]  # 3 was generated once: 2.0 - 1.0 < 1.5
    assert sample(apply_processors(logits, [p], ctx), [p], [None]) == [4]
    assert sample(logits, [p], [None]) == [3]


def test_logprobs_are_log_softmax_with_top_alternatives() -> None:
    torch.manual_seed(1)
    logits = torch.randn(3, VOCAB)
    params = [SamplingParams(logprobs=3), SamplingParams(), SamplingParams(logprobs=0)]
    tokens = [5, 2, 7]
    out = token_logprobs(logits, tokens, params)
    ref = torch.log_softmax(logits, dim=-1)
    assert out[1] is None
    assert out[0] is not None and out[2] is not None
    assert out[0].logprob == pytest.approx(float(ref[0, 5]), abs=1e-6)
    order = ref[0].argsort(descending=True)[:3].tolist()
    assert [t for t, _ in out[0].top] == order
    assert [v for _, v in out[0].top] == pytest.approx(ref[0, order].tolist(), abs=1e-6)
    assert out[2].top == () and out[2].logprob == pytest.approx(float(ref[2, 7]), abs=1e-6)


def test_min_p_keeps_only_tokens_near_the_top() -> None:
    logits = torch.full((1, VOCAB), -10.0)
    logits[0, 1], logits[0, 2] = 5.0, 4.0  # p(2)/p(1) = e^-1 ~ 0.37
    p = SamplingParams(temperature=1.0, min_p=0.5, seed=0)
    draws = {sample(logits, [p], [torch.Generator().manual_seed(s)])[0] for s in range(40)}
    assert draws == {1}
    loose = SamplingParams(temperature=1.0, min_p=0.3)
    draws = {sample(logits, [loose], [torch.Generator().manual_seed(s)])[0] for s in range(40)}
    assert draws == {1, 2}


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3.0}, "frequency_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"logit_bias": ((1, 101.0),)}, "logit_bias"),
        ({"min_tokens": 20, "max_tokens": 10}, "min_tokens"),
        ({"min_p": 1.5}, "min_p"),
        ({"logprobs": 21}, "logprobs"),
        ({"resumed_tokens": -1}, "resumed_tokens"),
    ],
)
def test_bad_values_name_their_field(kwargs: dict, field: str) -> None:
    with pytest.raises(InvalidRequestError) as e:
        SamplingParams(**kwargs).validate()
    assert e.value.field == field


def reference_masks(logits: list[float], p: SamplingParams, output: list[int]) -> list[float]:
    """vLLM's allowed_token_ids and bad_words, token by token: every id not allowed is
    -inf; a bad word's last id is -inf when the output ends with the ids before it."""
    out = [x if not p.allowed_token_ids or t in p.allowed_token_ids else -math.inf
           for t, x in enumerate(logits)]  # fmt: skip
    for word in p.bad_words:
        *head, last = word
        if not head or output[len(output) - len(head) :] == head:
            out[last] = -math.inf
    return out


MASK_CASES = [
    (SamplingParams(allowed_token_ids=(2, 5, 7)), []),
    (SamplingParams(bad_words=((4,),)), [1]),  # a one-token word: always banned
    (SamplingParams(bad_words=((3, 9), (8, 3, 6))), [1, 8, 3]),  # both heads match
    (SamplingParams(bad_words=((3, 9), (8, 3, 6))), [3, 1]),  # neither does
    (SamplingParams(allowed_token_ids=(1, 9), bad_words=((2, 9),)), [2]),
]


def test_allowed_ids_and_bad_words_match_the_reference() -> None:
    torch.manual_seed(1)
    logits = torch.randn(len(MASK_CASES), VOCAB)
    params = [p for p, _ in MASK_CASES]
    ctx = [RowContext([0], out) for _, out in MASK_CASES]
    got = apply_processors(logits, params, ctx)
    want = [reference_masks(logits[i].tolist(), p, o) for i, (p, o) in enumerate(MASK_CASES)]
    assert torch.allclose(got, torch.tensor(want), atol=1e-6)
    assert set(torch.isfinite(got[0]).nonzero().flatten().tolist()) == {2, 5, 7}
    assert got[2, 9] == -math.inf and got[2, 6] == -math.inf and torch.isfinite(got[3]).all()
    assert set(torch.isfinite(got[4]).nonzero().flatten().tolist()) == {1}  # 9 banned after 2


def test_sampled_ids_obey_allowed_token_ids_and_bad_words() -> None:
    g = torch.Generator().manual_seed(3)
    allowed = SamplingParams(temperature=1.0, allowed_token_ids=(3, 4))
    banned = SamplingParams(temperature=1.0, bad_words=((6,), (2, 7)))
    for _ in range(50):
        row = torch.randn(2, VOCAB, generator=g)
        row[:, 6] += 50.0  # what the model wants most
        row[:, 7] += 40.0
        logits = apply_processors(
            row, [allowed, banned], [RowContext([0], []), RowContext([0], [2])]
        )
        a, b = sample(logits, [allowed, banned], [g, g])
        assert a in (3, 4) and b not in (6, 7)
    greedy = SamplingParams(temperature=0, allowed_token_ids=(1,))
    logits = apply_processors(torch.randn(1, VOCAB), [greedy], [RowContext([0], [])])
    assert sample(logits, [greedy], [None]) == [1]


def reference_ngram_ban(history: list[int], n: int) -> set[int]:
    """transformers' no_repeat_ngram_size, by brute force: every id that, appended to
    `history`, would make its last n-gram one seen before."""
    grams = [tuple(history[i : i + n]) for i in range(len(history) - n + 1)]
    return {t for t in range(VOCAB) if len(history) >= n - 1 and
            tuple([*history, t][len(history) + 1 - n :]) in grams}  # fmt: skip


@pytest.mark.parametrize(
    ("n", "prompt", "output"),
    [
        (2, [1, 2, 3], [1]),  # 1 was followed by 2: 2 is banned
        (2, [1, 2], [1, 3, 1]),  # 1 was followed by 2 and 3
        (3, [4, 5, 6, 4, 5, 7], [4, 5]),  # (4, 5) was followed by 6 and 7
        (3, [4, 5], [6]),  # (5, 6) never seen
        (1, [3, 8], [3]),  # every id seen is banned
        (4, [1], []),  # shorter than n: nothing banned
    ],
)
def test_no_repeat_ngram_size_bans_what_the_reference_bans(
    n: int, prompt: list[int], output: list[int]
) -> None:
    p = SamplingParams(no_repeat_ngram_size=n)
    logits = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(n))
    got = apply_processors(logits, [p], [RowContext(prompt, output)])[0]
    banned = set((got == -math.inf).nonzero().flatten().tolist())
    assert banned == reference_ngram_ban([*prompt, *output], n)
    assert torch.equal(got[torch.isfinite(got)], logits[0][torch.isfinite(got)])


def test_no_repeat_ngram_size_counts_resumed_output_once() -> None:
    """A resumed request's streamed output is the end of its prompt here (`resumed_ids`): the
    n-grams read it once, in order, as the history the client saw."""
    p = SamplingParams(no_repeat_ngram_size=2)
    logits = torch.zeros(1, VOCAB)
    resumed = RowContext([1, 2], [5], resumed_ids=[9, 5])  # history 1 2 9 5 5
    got = apply_processors(logits, [p], [resumed])[0]
    assert set((got == -math.inf).nonzero().flatten().tolist()) == {5}  # (5, 5) seen
    with pytest.raises(InvalidRequestError, match="no_repeat_ngram_size"):
        SamplingParams(no_repeat_ngram_size=-1).validate()
