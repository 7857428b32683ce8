"""Cache slots of a sequence's positions: the tests' own page arithmetic, so the kernels'
tests need nothing of `nitsum` (the engine's is nitsum/kv/pages.py `context_slots`)."""

from __future__ import annotations

import torch


def seq_slots(pages: list[int], length: int, page_tokens: int, start: int = 0) -> torch.Tensor:
    """Slots of positions [start, length) of a sequence owning `pages` (in order)."""
    every = torch.tensor(pages, dtype=torch.long)[:, None] * page_tokens
    return (every + torch.arange(page_tokens)).flatten()[start:length]
