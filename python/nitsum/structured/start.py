"""A sequence's grammar over its life: started (and replayed) when the request is added,
advanced by each token it samples, ending it when the grammar is complete."""

from __future__ import annotations

from nitsum.errors import InvalidRequestError
from nitsum.structured.compiler import current
from nitsum.structured.matcher import GrammarMatcher
from nitsum.structured.spec import FIELD, GrammarSpec


def start_grammar(spec: GrammarSpec | None, prompt_ids: list[int]) -> GrammarMatcher | None:
    """A matcher for `spec` (None without one) that has consumed the `spec.replay` output
    tokens that end `prompt_ids`; InvalidRequestError naming `response_format` otherwise."""
    if spec is None:
        return None
    if spec.replay >= len(prompt_ids):
        raise InvalidRequestError(FIELD, f"grammar replay {spec.replay} leaves no prompt")
    matcher = current().matcher(spec)
    if spec.replay and not matcher.consume(prompt_ids[-spec.replay :]):
        raise InvalidRequestError(FIELD, f"the replayed output breaks the grammar: {matcher.error}")
    return matcher


def grammar_finish(matcher: GrammarMatcher, token: int) -> tuple[str | None, str | None]:
    """Advance `matcher` over the sampled `token` (one that did not already end the
    sequence); (finish reason, error): "stop" once the grammar is complete, "error" if the
    token broke it (the mask allows none such: a bug, reported rather than hidden)."""
    if not matcher.consume([token]):
        return "error", f"grammar refused token {token}: {matcher.error}"
    return ("stop", None) if matcher.done else (None, None)
