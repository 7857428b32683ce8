"""What a step gives a request: its new tokens, and on its last output why it finished."""

from __future__ import annotations

from dataclasses import dataclass

from nitsum.sampling_logprobs import TokenLogprob


@dataclass
class RequestOutput:
    """Tokens a request produced in one step; `finish_reason` set on its last output."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None
    # Why, when `finish_reason` is "error" and the engine knows (else None).
    error: str | None = None
    # On a request's first token: seconds from its arrival to its first scheduled step.
    queue_s: float | None = None
    # One per new token when the request asked for logprobs (else None).
    logprobs: list[TokenLogprob] | None = None
    # On a request's first token, when it asked: its prompt tokens' logprobs after the first.
    prompt_logprobs: list[TokenLogprob] | None = None
    # On a request's first token: its prompt tokens found in the prefix cache.
    cached_tokens: int | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
