"""Host → device copies that never make the host wait for the device.

NOTE (why): on CUDA a copy from pageable host memory with `non_blocking=False` (what
`.to(device)`, `torch.tensor(..., device=...)` and indexing a CUDA tensor with a Python list
do) synchronizes the stream: the host waits until the device has run everything queued
before it. In an overlapped step (engine/overlap.py) that is the whole previous step and
the pieces of this one already launched, so one such copy in the forward undoes the overlap.
Copies here go through pinned memory, asynchronously; off CUDA they are plain copies.
"""

from __future__ import annotations

import torch


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`t` (on the host) on `device` without the host waiting for it (as is off CUDA)."""
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def index_on(rows: list[int], device: torch.device) -> torch.Tensor:
    """`rows` as a long index tensor on `device` (for `index_select`: never index a device
    tensor with the list itself)."""
    return to_device(torch.tensor(rows, dtype=torch.long), device)
