"""The batched token mask: rows with a grammar keep only the tokens it allows next."""

from __future__ import annotations

from collections.abc import Sequence

import llguidance
import torch

from nitsum.structured.matcher import GrammarMatcher

_executor: llguidance.LLExecutor | None = None
# Row i: the 8 bits of byte value i, least significant first (llguidance's bit order).
_BYTE_BITS = ((torch.arange(256).unsqueeze(1) >> torch.arange(8)) & 1).bool()


def _exec() -> llguidance.LLExecutor:
    global _executor
    if _executor is None:
        # NOTE: a small pool: the worker's CPU cores are mostly the model's.
        _executor = llguidance.LLExecutor(num_threads=2)
    return _executor


def allowed(matchers: Sequence[GrammarMatcher], vocab: int) -> torch.Tensor:
    """(len(matchers), vocab) bool: the tokens each matcher allows next (ids beyond the
    tokenizer's vocabulary never)."""
    words = (max(vocab, *(m.vocab_size for m in matchers)) + 31) // 32
    bits = torch.zeros((len(matchers), words), dtype=torch.int32)
    # NOTE: llguidance writes each row's mask (its tokenizer's words) `words` int32 apart;
    # the logits may cover more ids (padded embeddings) or fewer than the tokenizer.
    _exec().unsafe_compute_mask_ptr(
        [(m.inner, i) for i, m in enumerate(matchers)], bits.data_ptr(), words * 4, len(matchers)
    )
    # NOTE: token t is bit t % 32 of word t // 32; on a little-endian host that is bit
    # t % 8 of byte t // 8, so a byte-to-bits table unpacks the mask in one gather.
    unpacked = _BYTE_BITS[bits.view(torch.uint8).long()]
    return unpacked.reshape(len(matchers), words * 32)[:, :vocab]


def apply_grammars(logits: torch.Tensor, matchers: Sequence[GrammarMatcher | None]) -> torch.Tensor:
    """`logits` with -inf where each row's grammar forbids a token; rows without one (None)
    are unchanged. One mask computation for the whole batch.

    NOTE: out of place: the worker's logits are inference tensors, which may not be
    updated in place outside inference mode.
    """
    present = [(i, m) for i, m in enumerate(matchers) if m is not None]
    if not present:
        return logits
    forbid = torch.zeros(logits.shape, dtype=torch.bool)
    forbid[[i for i, _ in present]] = ~allowed([m for _, m in present], logits.shape[-1])
    return logits.masked_fill(forbid.to(logits.device), float("-inf"))
