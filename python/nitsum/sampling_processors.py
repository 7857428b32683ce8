"""Logit processors applied before sampling, batched over the rows that ask for one:
allowed_token_ids, logit_bias, bad_words, no_repeat_ngram_size, min_tokens, then repetition,
frequency and presence penalties (vLLM's semantics and order; transformers' for the n-grams).
Rows with neutral parameters are not touched (no cost for them)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from nitsum.sampling import SamplingParams


@dataclass(frozen=True)
class RowContext:
    """What a row's processors read: its prompt, its output so far, and the ids `min_tokens`
    masks (EOS unless ignore_eos, and the stop token ids). `resumed_ids`: output streamed
    before the request was resumed on this worker (the end of its prompt here): the penalties
    count it as output; `min_tokens` does not (the router already lowered it by that much)."""

    prompt_ids: Sequence[int]
    output_ids: Sequence[int]
    end_ids: Sequence[int] = ()
    resumed_ids: Sequence[int] = ()

    @property
    def penalised_output(self) -> Sequence[int]:
        """The output the frequency, presence and repetition penalties count."""
        if not self.resumed_ids:
            return self.output_ids
        return [*self.resumed_ids, *self.output_ids]


def wants_processing(p: SamplingParams) -> bool:
    """Whether any processor of `p` is not neutral."""
    return bool(
        p.presence_penalty
        or p.frequency_penalty
        or p.repetition_penalty != 1.0
        or p.logit_bias
        or p.min_tokens
        or p.allowed_token_ids
        or p.bad_words
        or p.no_repeat_ngram_size
    )


def banned_by_bad_words(p: SamplingParams, output: Sequence[int]) -> list[int]:
    """The ids `p.bad_words` bans next after `output` (vLLM's rule: a word's last id when the
    output ends with the ids before it; a one-token word is always banned)."""
    banned = []
    for word in p.bad_words:
        head = word[:-1]
        if len(output) >= len(head) and tuple(output[len(output) - len(head) :]) == head:
            banned.append(word[-1])
    return banned


def banned_by_ngrams(n: int, history: Sequence[int]) -> list[int]:
    """The ids that would repeat an n-gram of `history` (prompt and output) as its next id:
    those that followed an earlier occurrence of its last n - 1 ids (transformers' rule)."""
    if n <= 0 or len(history) < n:
        return []
    ids = torch.as_tensor(list(history), dtype=torch.long)
    grams = ids.unfold(0, n, 1)  # every n-gram, one per row
    tail = ids[len(ids) - n + 1 :]
    return grams[(grams[:, : n - 1] == tail).all(dim=1), n - 1].unique().tolist()


def _id_matrix(lists: list[Sequence[int]], pad: int, device: torch.device) -> torch.Tensor:
    """Ragged id lists as one (rows, longest) tensor padded with `pad`."""
    width = max((len(x) for x in lists), default=0)
    out = torch.full((len(lists), max(width, 1)), pad, dtype=torch.long, device=device)
    for r, ids in enumerate(lists):
        if ids:
            out[r, : len(ids)] = torch.as_tensor(list(ids), dtype=torch.long, device=device)
    return out


def _counts(lists: list[Sequence[int]], vocab: int, like: torch.Tensor) -> torch.Tensor:
    """(rows, vocab) occurrence counts of each row's ids (ids outside the vocab ignored)."""
    # NOTE: padding and out-of-vocab ids land in an extra column that is dropped.
    ids = _id_matrix(lists, vocab, like.device).clamp(0, vocab)
    counts = torch.zeros(len(lists), vocab + 1, dtype=like.dtype, device=like.device)
    counts.scatter_add_(1, ids, torch.ones_like(ids, dtype=like.dtype))
    return counts[:, :vocab]


def apply_processors(
    logits: torch.Tensor, params: Sequence[SamplingParams], contexts: Sequence[RowContext]
) -> torch.Tensor:
    """`logits` (rows, vocab) with each row's processors applied; the input itself when no
    row asks (else a new tensor: the caller's logits are not modified)."""
    rows = [i for i, p in enumerate(params) if wants_processing(p)]
    if not rows:
        return logits
    vocab = logits.shape[-1]
    ps = [params[i] for i in rows]
    ctx = [contexts[i] for i in rows]
    sub = logits[rows].clone()
    col = lambda xs: torch.tensor(xs, dtype=sub.dtype, device=sub.device).unsqueeze(1)  # noqa: E731

    for r, p in enumerate(ps):
        if p.allowed_token_ids:
            # NOTE: every other id is masked, even when none of these is in the vocab
            # (the row then fails to sample: an error, never an id the client forbade).
            keep = torch.full((vocab,), float("-inf"), dtype=sub.dtype, device=sub.device)
            allowed = [t for t in p.allowed_token_ids if t < vocab]
            keep[allowed] = 0.0
            sub[r] += keep
        for token, bias in p.logit_bias:
            if 0 <= token < vocab:
                sub[r, token] += bias
        banned = banned_by_bad_words(p, ctx[r].penalised_output)
        if p.no_repeat_ngram_size:
            history = [*ctx[r].prompt_ids, *ctx[r].penalised_output]
            banned += banned_by_ngrams(p.no_repeat_ngram_size, history)
        banned = [t for t in banned if 0 <= t < vocab]
        if banned:
            sub[r, banned] = float("-inf")
        if len(ctx[r].output_ids) < p.min_tokens:
            ends = [t for t in ctx[r].end_ids if 0 <= t < vocab]
            if ends:
                sub[r, ends] = float("-inf")

    out_counts = _counts([c.penalised_output for c in ctx], vocab, sub)
    rep = col([p.repetition_penalty for p in ps])
    if bool((rep != 1.0).any()):
        # Over prompt and output: positive logits divided, negative ones multiplied.
        seen = (_counts([c.prompt_ids for c in ctx], vocab, sub) + out_counts) > 0
        penalised = torch.where(sub > 0, sub / rep, sub * rep)
        sub = torch.where(seen, penalised, sub)
    freq = col([p.frequency_penalty for p in ps])
    pres = col([p.presence_penalty for p in ps])
    # Over generated tokens only: minus freq per occurrence, minus pres once if present.
    sub = sub - freq * out_counts - pres * (out_counts > 0).to(sub.dtype)

    out = logits.clone()
    out[rows] = sub
    return out
