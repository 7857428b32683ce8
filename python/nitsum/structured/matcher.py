"""One sequence's position in its grammar."""

from __future__ import annotations

import llguidance


class GrammarMatcher:
    """Wraps llguidance's matcher: consume sampled tokens, say when the grammar is done.

    NOTE: the matcher has consumed exactly the sequence's output tokens (and those replayed
    from its prompt): the engine advances it with each token it appends, and preemption
    keeps both, so a recomputed sequence goes on where it was.
    """

    def __init__(self, inner: llguidance.LLMatcher, vocab_size: int) -> None:
        self.inner = inner
        # The tokenizer's vocabulary: the width of this matcher's masks.
        self.vocab_size = vocab_size

    def consume(self, tokens: list[int]) -> bool:
        """Advance over `tokens`; False if the grammar refuses one (see `error`)."""
        return self.inner.consume_tokens(tokens)

    @property
    def done(self) -> bool:
        """The grammar is complete and allows no further token (the sequence can stop)."""
        return self.inner.is_stopped() and not self.inner.is_error()

    @property
    def accepting(self) -> bool:
        """What was consumed is a complete match (more may still be allowed)."""
        return self.inner.is_accepting()

    @property
    def error(self) -> str | None:
        """Why the matcher failed (a token it refused), else None."""
        if not self.inner.is_error():
            return None
        # llguidance marks an error without its parser state so; the marker says nothing.
        return (self.inner.get_error() or "").removesuffix("<non-verbose/>").strip() or None
