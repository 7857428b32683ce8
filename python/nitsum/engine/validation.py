"""A request's checks before it is queued: each failure an `InvalidRequestError` naming the
field, so the router answers 400 with the OpenAI error body and nothing was queued."""

from __future__ import annotations

from nitsum.errors import InvalidRequestError
from nitsum.kv.pages import GroupPages
from nitsum.sampling import SamplingParams


def validate_request(
    prompt_ids: list[int],
    sampling: SamplingParams,
    vocab_size: int,
    max_context: int,
    pages: GroupPages,
) -> None:
    """Raise InvalidRequestError unless `prompt_ids` and `sampling` can run on an engine of
    this vocabulary, context window and page pool.
    NOTE: the sampling values are checked before (the router, or `LLM.generate`)."""
    if not prompt_ids:
        raise InvalidRequestError("prompt", "must not be empty")
    if sampling.resumed_tokens >= len(prompt_ids):
        raise InvalidRequestError(
            "resumed_tokens",
            f"{sampling.resumed_tokens} leaves no prompt of the {len(prompt_ids)} ids",
        )
    if len(prompt_ids) >= max_context:
        raise InvalidRequestError(
            "prompt",
            f"has {len(prompt_ids)} tokens; the context window is {max_context} "
            "and at least one token must be generated",
        )
    bad = [t for t in prompt_ids if not 0 <= t < vocab_size]
    if bad:
        raise InvalidRequestError("prompt", f"token id {bad[0]} outside [0, {vocab_size})")
    need = pages.pages_for(len(prompt_ids) + 1)
    if need > pages.num_pages:
        raise InvalidRequestError(
            "prompt", f"needs {need} KV pages but the whole pool has {pages.num_pages}"
        )
