"""Turn a scheduled batch into model inputs and the attention plan."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain

import numpy as np
import torch

from nitsum.engine.scheduled import Scheduled
from nitsum.kv.pages import context_slots
from nitsum_kernels.paged_attention import AttentionMetadata, PrefillSegment


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # (tokens,) long
    positions: torch.Tensor  # (tokens,) long
    meta: AttentionMetadata
    # Rows whose logits the step returns, in batch order: per entry its prompt-scoring rows
    # (Sequence.scored_positions), then its sampled row.
    sample_rows: list[int]
    # Run the group as sequence parallelism this step (parallel/shift.py decides); TP if False.
    sequence_parallel: bool = False
    # A pipeline's micro-batches, in order (their rows concatenated are this batch's); empty:
    # one batch. NOTE: a stage runs them one after the other, handing each to the next stage
    # without waiting, so the stages work on different micro-batches at once.
    micro: list[StepInputs] = field(default_factory=list)
    # A pipeline step: the TP degree of its stages (the group is then its members as
    # len(members) // stage_tp stages); 0: the group is one TP group.
    stage_tp: int = 0

    @property
    def parts(self) -> list[StepInputs]:
        """The batches a forward runs: the micro-batches, or this one."""
        return self.micro or [self]


def split_batch(batch: list[Scheduled], parts: int) -> list[list[Scheduled]]:
    """`batch` cut into at most `parts` contiguous runs of about equal tokens (a pipeline's
    micro-batches; each stays decode-first, and their order is the batch's)."""
    parts = max(1, min(parts, len(batch)))
    total = sum(item.q_len for item in batch)
    out: list[list[Scheduled]] = [[]]
    done = 0
    for i, item in enumerate(batch):
        left = len(batch) - i  # items from here on, this one included
        cut = done >= total * len(out) / parts and out[-1]
        if cut and len(out) < parts or out[-1] and parts - len(out) >= left:
            out.append([])
        out[-1].append(item)
        done += item.q_len
    return out


def build_pipeline_inputs(
    batch: list[Scheduled], tokens_per_page: int, stage_tp: int, micro_batches: int
) -> StepInputs:
    """A pipeline's step (stages of `stage_tp` devices): the whole batch's inputs with
    `micro_batches` micro-batches."""
    inputs = build_step_inputs(batch, tokens_per_page)
    inputs.stage_tp = stage_tp
    parts = split_batch(batch, micro_batches)
    if len(parts) > 1:
        inputs.micro = [build_step_inputs(part, tokens_per_page) for part in parts]
    return inputs


def build_step_inputs(
    batch: list[Scheduled], tokens_per_page: int, sequence_parallel: bool = False
) -> StepInputs:
    """NOTE: `batch` must be decode-first (all q_len == 1 entries with context before it)."""
    ids: list[int] = []
    positions: list[int] = []
    slots: list[torch.Tensor] = []
    sample_rows: list[int] = []
    decode_pages: list[list[int]] = []
    decode_lens: list[int] = []
    prefills: list[PrefillSegment] = []
    # One-token rows' slots, computed here (a tensor per row cost more than the row's work).
    single: list[int] = []
    for item in batch:
        seq, start, q_len = item.seq, item.start, item.q_len
        ctx_len = start + q_len
        row = len(ids)
        ids.extend(seq.token_slice(start, q_len))
        positions.extend(range(start, ctx_len))
        pages = seq.pages[: -(-ctx_len // tokens_per_page)]
        if q_len == 1:
            page, offset = divmod(start, tokens_per_page)
            single.append(pages[page] * tokens_per_page + offset)
        else:
            if single:  # NOTE: keeps the slots in row order
                slots.append(torch.tensor(single, dtype=torch.long))
                single = []
            slots.append(context_slots(pages, ctx_len, tokens_per_page, start))
        if q_len == 1 and start > 0 and not prefills:
            decode_pages.append(pages)
            decode_lens.append(ctx_len)
        else:
            prefills.append(
                PrefillSegment(row, q_len, ctx_len, torch.tensor(pages, dtype=torch.long))
            )
        sample_rows.extend(row + p - start for p in seq.scored_positions(start, q_len))
        if item.sample:
            sample_rows.append(row + q_len - 1)
    if single:
        slots.append(torch.tensor(single, dtype=torch.long))
    meta = AttentionMetadata(
        slot_mapping=torch.cat(slots) if slots else torch.zeros(0, dtype=torch.long),
        page_tokens=tokens_per_page,
        n_decode=len(decode_pages),
        decode_pages=page_table(decode_pages),
        decode_lens=torch.tensor(decode_lens, dtype=torch.long),
        decode_max_len=max(decode_lens, default=0),
        prefills=prefills,
    )
    return StepInputs(
        torch.tensor(ids, dtype=torch.long),
        torch.tensor(positions, dtype=torch.long),
        meta,
        sample_rows,
        sequence_parallel,
    )


def page_table(rows: list[list[int]]) -> torch.Tensor:
    """`rows` of page ids as one (len(rows), longest) long tensor, zero-padded.

    NOTE: the one per-step cost that grows with the batch's total context (every page of
    every decoding row); built from one flat array and a mask, about 3x faster than padding
    each row's list.
    """
    lens = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    width = int(lens.max()) if len(rows) else 0
    flat = np.fromiter(chain.from_iterable(rows), dtype=np.int64, count=int(lens.sum()))
    table = np.zeros((len(rows), width), dtype=np.int64)
    table[np.arange(width) < lens[:, None]] = flat
    return torch.from_numpy(table)
