"""A TP group's collectives as one rank sees them: the one interface the forward calls
(`TPContext.all_reduce`, SP's all-to-alls and row gather), whatever carries them.

- `ProcessGroupCollectives`: a torch.distributed group (gloo on CPU devices; NCCL on GPUs,
  each process on a GPU of its own). NCCL calls are captured inside CUDA graphs.
- `SharedCollectives` (parallel/shared_collectives.py): buffers every member maps (memory
  files on CPU, CUDA IPC on GPUs), synchronized by host flags: several device processes on
  one GPU, which NCCL refuses. They cannot be captured: a recorded step is cut at each call
  (parallel/capture_cuts.py).

`communicators.py` chooses one per group at start-up.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.distributed as dist


class Collectives(Protocol):
    """The collectives of one group, called by every member in the same order."""

    def all_reduce(self, x: torch.Tensor) -> None:
        """Sum `x` over the members, in place; every member gets the same bits."""
        ...

    def all_gather(self, parts: list[torch.Tensor], x: torch.Tensor) -> None:
        """parts[j] = member j's `x` (all of one shape)."""
        ...

    def all_to_all_single(self, recv: torch.Tensor, send: torch.Tensor) -> None:
        """recv[j] = member j's send[rank] (both (members, ...) and contiguous)."""
        ...


class ProcessGroupCollectives:
    """The collectives of a torch.distributed process group."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group = group

    def all_reduce(self, x: torch.Tensor) -> None:
        dist.all_reduce(x, group=self.group)

    def all_gather(self, parts: list[torch.Tensor], x: torch.Tensor) -> None:
        dist.all_gather(parts, x, group=self.group)

    def all_to_all_single(self, recv: torch.Tensor, send: torch.Tensor) -> None:
        dist.all_to_all_single(recv, send, group=self.group)
