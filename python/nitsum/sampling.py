"""Sampling parameters and the batched sampler."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from nitsum.codec import closed
from nitsum.errors import InvalidRequestError
from nitsum.structured.mask import apply_grammars
from nitsum.structured.matcher import GrammarMatcher
from nitsum.structured.spec import GrammarSpec
from nitsum_kernels.host_copy import index_on, to_device

log = logging.getLogger(__name__)

# NOTE: temperatures below this are greedy: dividing logits by a denormal temperature
# (1e-40) overflows them to inf and the softmax to NaN, which failed the whole batch.
GREEDY_BELOW = 1e-5
# Most alternatives per token a request may ask for (OpenAI's limit).
MAX_LOGPROBS = 20


@closed
@dataclass(frozen=True)
class Sampling:
    """How a token is drawn: the sampler's knobs and logit processors (the `generate`
    message's `sampling` part, as the router's Rust `Sampling` is; neutral defaults cost
    nothing).

    NOTE: a new knob is one field here, its range check in `SamplingParams.validate` (the
    in-process API's; the router checks its own) and its processor (sampling_processors.py)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    # Logit processors (sampling_processors.py, vLLM's semantics).
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    # (token id, bias added to its logit) pairs, OpenAI's `logit_bias`.
    logit_bias: tuple[tuple[int, float], ...] = ()
    min_p: float = 0.0
    # vLLM's `allowed_token_ids`: only these ids may be sampled (empty: any).
    allowed_token_ids: tuple[int, ...] = ()
    # vLLM's `bad_words`, as token id sequences (the router tokenizes each word with and
    # without a leading space): a sequence's last id is banned when the output ends with
    # the ids before it.
    bad_words: tuple[tuple[int, ...], ...] = ()
    # Every n-gram of this size occurs at most once in prompt and output (transformers'
    # `no_repeat_ngram_size`): the id that would repeat one is masked. 0: off.
    no_repeat_ngram_size: int = 0


@closed
@dataclass(frozen=True)
class Stop:
    """When the output ends (the `generate` message's `stop` part).

    NOTE: on the wire `stop_token_ids` holds the model's EOS already (the router adds it
    unless `ignore_eos`; the in-process `LLM` adds it too); the engine adds nothing."""

    max_tokens: int = 16
    # EOS and stop token ids are masked until this many tokens were generated.
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False


@closed
@dataclass(frozen=True)
class Output:
    """What is returned besides the tokens (the `generate` message's `output` part)."""

    # Alternatives returned with each token's logprob (sampling_logprobs.py); None: no logprobs.
    logprobs: int | None = None
    # The same for each prompt token after the first (OpenAI's echo with logprobs); None: off.
    prompt_logprobs: int | None = None


@dataclass(frozen=True)
class SamplingParams(Output, Stop, Sampling):
    """How to pick tokens and when to stop: the fields of `Sampling`, `Stop` and `Output`
    (one declaration each) and what the engine adds. temperature 0 (or below
    `GREEDY_BELOW`) means greedy."""

    # Structured output: the output must match this grammar (nitsum/structured/).
    grammar: GrammarSpec | None = None
    # The last this-many prompt ids are output streamed before the request was resumed here
    # (the router's); the penalties count them as output, as they were.
    resumed_tokens: int = 0

    def validate(self) -> None:
        """Raise InvalidRequestError naming the first bad field."""
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise InvalidRequestError(
                "max_tokens", f"must be an integer >= 1, got {self.max_tokens!r}"
            )
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise InvalidRequestError(
                "temperature", f"must be a finite number >= 0, got {self.temperature}"
            )
        if not 0 < self.top_p <= 1:
            raise InvalidRequestError("top_p", f"must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise InvalidRequestError("top_k", f"must be -1 (off) or >= 1, got {self.top_k}")
        self._validate_processors()

    def _validate_processors(self) -> None:
        """The logit processors' and logprobs' fields (OpenAI's and vLLM's ranges)."""
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not -2 <= v <= 2:
                raise InvalidRequestError(name, f"must be in [-2, 2], got {v}")
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise InvalidRequestError(
                "repetition_penalty", f"must be a number > 0, got {self.repetition_penalty}"
            )
        for token, bias in self.logit_bias:
            if not -100 <= bias <= 100:
                raise InvalidRequestError(
                    "logit_bias", f"bias for token {token} must be in [-100, 100], got {bias}"
                )
            if token < 0:
                raise InvalidRequestError("logit_bias", f"token id {token} is negative")
        if self.min_tokens < 0 or self.min_tokens > self.max_tokens:
            raise InvalidRequestError(
                "min_tokens", f"must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}"
            )
        if self.prompt_logprobs is not None and not 0 <= self.prompt_logprobs <= MAX_LOGPROBS:
            raise InvalidRequestError(
                "prompt_logprobs",
                f"must be in [0, {MAX_LOGPROBS}] alternatives, got {self.prompt_logprobs}",
            )
        if self.resumed_tokens < 0:
            raise InvalidRequestError(
                "resumed_tokens", f"must be an integer >= 0, got {self.resumed_tokens}"
            )
        if not 0 <= self.min_p <= 1:
            raise InvalidRequestError("min_p", f"must be in [0, 1], got {self.min_p}")
        if any(t < 0 for t in self.allowed_token_ids):
            raise InvalidRequestError("allowed_token_ids", "token ids must be >= 0")
        if self.no_repeat_ngram_size < 0:
            raise InvalidRequestError(
                "no_repeat_ngram_size", f"must be >= 0 (0: off), got {self.no_repeat_ngram_size}"
            )
        if any(not word or min(word) < 0 for word in self.bad_words):
            raise InvalidRequestError("bad_words", "each word must be a non-empty id sequence")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise InvalidRequestError(
                "logprobs", f"must be in [0, {MAX_LOGPROBS}] alternatives, got {self.logprobs}"
            )

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW


def make_generator(params: SamplingParams) -> torch.Generator | None:
    """A per-request RNG so seeded requests repeat exactly whatever else is batched."""
    if params.greedy or params.seed is None:
        return None
    return torch.Generator().manual_seed(params.seed)


# A greedy row's parameters (`sample` passes seeded rows to the device sampler as this).
GREEDY = SamplingParams(temperature=0.0)

# A row whose sampling failed (e.g. non-finite probabilities): its request alone ends with an
# error, the rest of the batch goes on.
SAMPLE_FAILED = -1


def sample(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
    grammars: Sequence[GrammarMatcher | None] = (),
) -> list[int]:
    """One token per row of float32 `logits` (rows, vocab); `SAMPLE_FAILED` for a row that
    could not be sampled. Rows with a grammar matcher sample only tokens it allows next.

    NOTE: one read of the tokens by the host for the whole batch. Unseeded random rows draw
    together on the logits' device (`sample_on_device`); a seeded row draws from its own CPU
    generator on the host (so it repeats exactly whatever it is batched with)."""
    logits = apply_grammars(logits, grammars)
    unseeded = [p if generators[i] is None else GREEDY for i, p in enumerate(params)]
    out = sample_on_device(logits, unseeded).tolist()
    failed = sum(
        1 for p, token in zip(unseeded, out, strict=True) if token == SAMPLE_FAILED and not p.greedy
    )
    if failed:
        log.warning("sampling failed for %d row(s): their distribution is not finite", failed)
    for i, (p, generator) in enumerate(zip(params, generators, strict=True)):
        if generator is None or p.greedy:
            continue
        try:
            probs = batch_probs(logits[i : i + 1], [p])[0].cpu()
            out[i] = int(torch.multinomial(probs, 1, generator=generator).item())
        except RuntimeError as e:  # torch: "probability tensor contains either inf, nan..."
            log.warning("sampling failed for one row (temperature %r): %s", p.temperature, e)
            out[i] = SAMPLE_FAILED
    return out


def batch_probs(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Each row's distribution after its temperature, top-k, min-p and top-p (vLLM's
    rules), for all rows at once: a handful of kernels whatever the batch (a loop over rows
    cost about eight launches a row, 500 a step at batch 64). No host sync.

    NOTE: every row must be random (temperature >= `GREEDY_BELOW`)."""
    device = logits.device
    knobs = to_device(
        torch.tensor(
            [[p.temperature, max(p.top_k, 0), p.min_p, p.top_p] for p in params],
            dtype=torch.float32,
        ),
        device,
    )
    temperature, top_k, min_p, top_p = knobs.unbind(dim=1)
    rows = logits / temperature[:, None]
    k_max = min(max((p.top_k for p in params), default=0), rows.shape[-1])
    if k_max > 0:
        top = torch.topk(rows, k_max, dim=-1).values  # descending
        kth = top.gather(1, (top_k.clamp(1, k_max) - 1).long()[:, None])
        kth = torch.where(top_k[:, None] > 0, kth, float("-inf"))  # top_k <= 0: no cut
        rows = rows.masked_fill(rows < kth, float("-inf"))
    probs = torch.softmax(rows, dim=-1)
    if any(p.min_p > 0 for p in params):
        # Drop tokens less likely than min_p times the most likely one (vLLM's min_p).
        probs = probs.masked_fill(probs < min_p[:, None] * probs.amax(-1, keepdim=True), 0.0)
    if any(p.top_p < 1 for p in params):
        sorted_p, idx = probs.sort(dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (always at least one token);
        # a row with top_p = 1 keeps all (its mass may round to 1 before the last token).
        limit = torch.where(top_p < 1, top_p, float("inf"))
        drop = sorted_p.cumsum(dim=-1) - sorted_p >= limit[:, None]
        probs = torch.zeros_like(probs).scatter_(-1, idx, sorted_p.masked_fill(drop, 0.0))
    return probs


def sample_on_device(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """One token per row of float32 `logits`, as a long tensor on their device, never read
    by the host (the overlapped step, engine/overlap.py); `SAMPLE_FAILED` for a row whose
    distribution is not finite.

    NOTE: for unseeded rows only (the device's own RNG): a seeded request's CPU generator
    needs the synchronous `sample`. The random rows draw together by the exponential race
    (argmax of p / E, E ~ Exp(1)), which picks token i with probability p_i like
    `torch.multinomial`, without its host-side checks."""
    tokens = logits.argmax(dim=-1)
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if not rows:
        return tokens
    index = None
    if len(rows) < len(params):
        index = index_on(rows, tokens.device)
        logits = logits.index_select(0, index)
    probs = batch_probs(logits, [params[i] for i in rows])
    bad = ~torch.isfinite(probs).all(dim=-1) | (probs.sum(dim=-1) <= 0)
    probs = torch.where(bad[:, None], torch.ones_like(probs), probs)
    drawn = torch.where(bad, SAMPLE_FAILED, draw(probs))
    return drawn if index is None else tokens.index_copy(0, index, drawn)


def draw(probs: torch.Tensor) -> torch.Tensor:
    """One token id per row of `probs` (rows, vocab; finite, each row's sum > 0), drawn with
    probability proportional to its entry, on their device without a host sync.

    NOTE: on a GPU the exponential race (argmax of p / E, E ~ Exp(1)): exact, and a
    vocabulary of random numbers is cheap there. On the CPU, where drawing them costs 7x the
    rest, the inverse CDF: one uniform per row against the row's running sum (`right`: a
    zero-probability token is never the first sum above it; the uniform is kept strictly
    below the total so the last token with mass bounds it)."""
    if probs.is_cuda:
        return (probs / torch.empty_like(probs).exponential_()).argmax(dim=-1)
    running = probs.double().cumsum(dim=-1)
    total = running[:, -1:]
    u = torch.rand(total.shape, dtype=torch.float64, device=probs.device) * total * (1 - 2**-40)
    return torch.searchsorted(running, u, right=True).squeeze(1)
