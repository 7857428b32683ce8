"""Per-token logprobs: the chosen token's and the top alternatives', from the processed
distribution (after logit_bias, min_tokens, penalties and a structured-output grammar's mask;
before temperature, top-k, top-p and min-p), which is the model's own log-softmax when no
processor or grammar applies (vLLM's `processed_logprobs` without temperature; OpenAI's
logprobs are the model's).

NOTE: a token masked out (the grammar forbids it, min_tokens holds back EOS) has logprob
-inf, which JSON cannot carry: it is reported as `LOGPROB_FLOOR`, as vLLM does, so that a
request still gets as many alternatives as it asked for (under a grammar that allows one
token, the others are forbidden ones at the floor).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from nitsum.sampling import SamplingParams

# The logprob reported for a token that cannot be sampled (vLLM's -9999.0).
LOGPROB_FLOOR = -9999.0


@dataclass(frozen=True)
class TokenLogprob:
    """One sampled token's logprob and its `top` alternatives as (token id, logprob), most
    likely first (empty when the request asked for 0 alternatives)."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_logprobs(
    logits: torch.Tensor,
    tokens: Sequence[int],
    params: Sequence[SamplingParams],
    field: str = "logprobs",
) -> list[TokenLogprob | None]:
    """For each row of `logits` (rows, vocab): the logprob of `tokens[i]` when its request
    asked for them (its `field`, `logprobs` or `prompt_logprobs`, gives the alternatives;
    None otherwise, and for a failed row's negative token)."""
    out: list[TokenLogprob | None] = [None] * len(tokens)
    want = [getattr(p, field) for p in params]
    rows = [i for i, k in enumerate(want) if k is not None and tokens[i] >= 0]
    if not rows:
        return out
    lp = torch.log_softmax(logits[rows].float(), dim=-1).clamp_min(LOGPROB_FLOOR)
    chosen = lp.gather(1, torch.tensor([[tokens[i]] for i in rows], device=lp.device))
    k = max(want[i] or 0 for i in rows)
    top_v, top_i = lp.topk(k, dim=-1) if k else (lp[:, :0], lp[:, :0].long())
    chosen_l, top_vl, top_il = chosen[:, 0].tolist(), top_v.tolist(), top_i.tolist()
    for r, i in enumerate(rows):
        n = want[i] or 0
        top = tuple(zip(top_il[r][:n], top_vl[r][:n], strict=True))
        out[i] = TokenLogprob(chosen_l[r], top)
    return out
