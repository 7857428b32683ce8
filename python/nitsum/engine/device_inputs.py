"""A step's inputs on the device without a host sync, some token ids taken from the device.

An overlapped step (engine/overlap.py) is prepared while the step before still runs, so the
token a decode row feeds may not have reached the host yet: the host's input ids hold a
placeholder there, and the row is filled on the device from the step before's sampled-token
tensor (`TokenFill`). Every host tensor goes over through pinned memory with a non-blocking
copy: a pageable copy would make the host wait for the device.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from nitsum.engine.scheduled import Scheduled
from nitsum.engine.step_inputs import StepInputs
from nitsum_kernels.host_copy import index_on, to_device


@dataclass
class TokenFill:
    """Input rows `dst` take the token ids at rows `src` of `tokens` (on the device)."""

    dst: list[int]
    src: list[int]
    tokens: torch.Tensor


def pending_rows(
    batch: list[Scheduled], rows: dict[int, int], pending: int
) -> tuple[list[int], list[int]]:
    """(input rows, token rows): each entry of `batch` whose step feeds its last token while
    that token is the placeholder `pending`, and that token's row in the step before's
    sampled tokens (`rows`, by id of the sequence).

    NOTE: a placeholder is only ever a sequence's last output id (the step before sampled it,
    and every older one was applied since), so only the last position is looked at."""
    dst: list[int] = []
    src: list[int] = []
    row = 0
    for item in batch:
        seq = item.seq
        last = seq.total_len - 1
        fed = item.start <= last < item.start + item.q_len
        if fed and seq.output_ids and seq.output_ids[-1] == pending:
            dst.append(row + last - item.start)
            src.append(rows[id(seq)])
        row += item.q_len
    return dst, src


def device_inputs(inputs: StepInputs, device: torch.device, fill: TokenFill | None) -> StepInputs:
    """`inputs` (one batch, no micro-batches) with its tensors on `device` and `fill`'s rows
    of the input ids taken from the device."""
    assert not inputs.micro, "an overlapped step is one batch"
    ids = to_device(inputs.input_ids, device)
    if fill is not None:
        dst, src = index_on(fill.dst, device), index_on(fill.src, device)
        # NOTE: a row whose sampling failed (SAMPLE_FAILED, -1) ends its request when it is
        # applied, so its next row is wasted anyway; clamped, it still is a valid id.
        ids = ids.index_copy(0, dst, fill.tokens.index_select(0, src).clamp(min=0))
    meta = inputs.meta
    meta = replace(
        meta,
        slot_mapping=to_device(meta.slot_mapping, device),
        decode_pages=to_device(meta.decode_pages, device),
        decode_lens=to_device(meta.decode_lens, device),
        prefills=[replace(s, pages=to_device(s.pages, device)) for s in meta.prefills],
    )
    return replace(inputs, input_ids=ids, positions=to_device(inputs.positions, device), meta=meta)
