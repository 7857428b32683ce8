"""Turn a scheduled batch into model inputs and the attention plan."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nitsum.engine.scheduler import Scheduled
from nitsum.kernels.paged_attention import AttentionMetadata, PrefillSegment
from nitsum.kv.pages import context_slots


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # (tokens,) long
    positions: torch.Tensor  # (tokens,) long
    meta: AttentionMetadata
    sample_rows: list[int]  # rows whose logits are sampled, in batch order
    # Run the group as sequence parallelism this step (parallel/shift.py decides); TP if False.
    sequence_parallel: bool = False


def build_step_inputs(
    batch: list[Scheduled], tokens_per_page: int, sequence_parallel: bool = False
) -> StepInputs:
    """NOTE: `batch` must be decode-first (all q_len == 1 entries with context before it)."""
    ids: list[int] = []
    positions: list[int] = []
    slots: list[torch.Tensor] = []
    sample_rows: list[int] = []
    decode_ctx: list[torch.Tensor] = []
    prefills: list[PrefillSegment] = []
    n_decode = 0
    for item in batch:
        seq, start, q_len = item.seq, item.start, item.q_len
        ctx_len = start + q_len
        row = len(ids)
        ids.extend(seq.token_slice(start, q_len))
        positions.extend(range(start, ctx_len))
        ctx = context_slots(seq.pages, ctx_len, tokens_per_page)
        slots.append(ctx[start:])
        if q_len == 1 and start > 0 and not prefills:
            n_decode += 1
            decode_ctx.append(ctx)
        else:
            mask = None
            if start > 0:
                # Query i (absolute position start+i) sees keys 0..start+i.
                mask = torch.arange(ctx_len)[None, :] <= torch.arange(start, ctx_len)[:, None]
            prefills.append(PrefillSegment(row, q_len, ctx, mask))
        if item.sample:
            sample_rows.append(row + q_len - 1)
    max_ctx = max((len(c) for c in decode_ctx), default=0)
    decode_slots = torch.zeros(n_decode, max_ctx, dtype=torch.long)
    decode_mask = torch.zeros(n_decode, 1, 1, max_ctx, dtype=torch.bool)
    for i, c in enumerate(decode_ctx):
        decode_slots[i, : len(c)] = c
        decode_mask[i, ..., : len(c)] = True
    meta = AttentionMetadata(
        slot_mapping=torch.cat(slots) if slots else torch.zeros(0, dtype=torch.long),
        n_decode=n_decode,
        decode_slots=decode_slots,
        decode_mask=decode_mask,
        prefills=prefills,
    )
    return StepInputs(
        torch.tensor(ids, dtype=torch.long),
        torch.tensor(positions, dtype=torch.long),
        meta,
        sample_rows,
        sequence_parallel,
    )
