"""Memory the device processes of one host map from each other, and the host flags that hand
it over.

A `SharedBuffer` is a flat byte tensor one process allocates, with a picklable `handle` that
a peer opens (`open_shared`) into its own mapping of the same bytes:

- on a CPU device, a memory file (`memfd`) each peer maps through `/proc/<pid>/fd/<fd>`;
- on a CUDA device, device memory shared by CUDA IPC (torch's own handles, as
  `torch.multiprocessing` shares CUDA tensors) between the processes that share one GPU.

Flags always live in host memory (a host `SharedBuffer`'s `words`): a writer finishes its
device work on a buffer (`fence`), then stores a flag word; a reader that sees the flag
launches its own work on the buffer. So the hand-off never spins on a GPU, which matters where
several processes share one GPU: their kernels are time-sliced, never concurrent.

NOTE: x86 makes stores visible in program order, so a flag written after a finished host copy
is never seen before the copied bytes; elsewhere (ARM) that needs fences, so `supported()` is
x86 only: elsewhere CPU devices use gloo, and processes cannot share a GPU.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

# A peer that does not answer within this many seconds is taken for dead.
WAIT_TIMEOUT_S = 60.0
# How often a waiter checks that the peers it waits for are still alive.
LIVENESS_EVERY_S = 0.01


class PeerTimeout(RuntimeError):
    """A peer did not hand something over in time, or its process is gone."""


def supported() -> bool:
    """Linux (memfd, /proc) on x86, whose in-order stores the flag hand-off relies on."""
    return (
        hasattr(os, "memfd_create")
        and os.path.isdir("/proc/self/fd")
        and platform.machine().lower() in ("x86_64", "amd64")
    )


@dataclass(frozen=True)
class Handle:
    """What a peer needs to map a buffer: the owner's pid, and either a memory file's fd
    (`cuda` None) or torch's CUDA IPC rebuild call."""

    pid: int
    nbytes: int
    fd: int = -1
    cuda: tuple[Any, tuple[Any, ...]] | None = None


class SharedBuffer:
    """`nbytes` of memory on `device` this process owns and its peers can map."""

    def __init__(self, nbytes: int, device: torch.device | str = "cpu") -> None:
        device = torch.device(device)
        self.nbytes = nbytes
        if device.type == "cuda":
            from torch.multiprocessing.reductions import reduce_tensor

            self.tensor = torch.zeros(nbytes, dtype=torch.uint8, device=device)
            rebuild, args = reduce_tensor(self.tensor)
            self.handle = Handle(os.getpid(), nbytes, cuda=(rebuild, args))
        else:
            fd = os.memfd_create("nitsum-shared")
            os.ftruncate(fd, max(nbytes, 1))
            self.tensor = _map(os.getpid(), fd, nbytes)
            self.handle = Handle(os.getpid(), nbytes, fd=fd)

    def words(self) -> torch.Tensor:
        """The buffer as int64 flag words (a host buffer's)."""
        return self.tensor.view(torch.int64)


def open_shared(handle: Handle) -> torch.Tensor:
    """This process's mapping of a peer's buffer (a flat uint8 tensor of `handle.nbytes`).

    NOTE: at start-up only: nothing is mapped on a step or switch path.
    """
    if handle.cuda is not None:
        rebuild, args = handle.cuda
        return rebuild(*args)
    return _map(handle.pid, handle.fd, handle.nbytes)


def _map(pid: int, fd: int, nbytes: int) -> torch.Tensor:
    return torch.from_file(f"/proc/{pid}/fd/{fd}", shared=True, size=nbytes, dtype=torch.uint8)


def fence(device: torch.device) -> None:
    """Finish this process's queued work on `device` (a copy into a shared buffer, or out of
    a peer's), so that a flag stored next says it is done. Nothing to wait for on a CPU."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, dead but not yet reaped by its parent, does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def wait_for(
    cond: Callable[[], bool],
    what: str,
    peers: dict[int, int],
    timeout_s: float = WAIT_TIMEOUT_S,
) -> None:
    """Wait until `cond()`: spin briefly, then poll with short sleeps (other devices may
    share the core), checking every `LIVENESS_EVERY_S` that the processes of `peers` (device
    id -> pid) are alive. PeerTimeout names the first dead peer, or the timeout."""
    for _ in range(200):
        if cond():
            return
    start = time.monotonic()
    checked = start
    while not cond():
        now = time.monotonic()
        if now - checked > LIVENESS_EVERY_S:
            checked = now
            for device, pid in peers.items():
                if not alive(pid):
                    raise PeerTimeout(f"device {device}'s process is gone: it did not {what}")
            if now - start > timeout_s:
                raise PeerTimeout(f"a peer did not {what} within {timeout_s:.0f}s")
        time.sleep(20e-6)
