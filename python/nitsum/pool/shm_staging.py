"""Shared-memory staging for KV moves between the device processes of one host (CPU).

Each device keeps its two transfer staging buffers and four flag words in memory files
(`memfd`), and maps every peer's at start-up (through `/proc/<pid>/fd/<fd>`). A sender packs
one chunk after another into its own two buffers; the receiver unpacks each straight from
its mapping of them. The flags carry the hand-off: `ready[b] = token` once buffer b holds the
chunk `token`, `done[b] = token` once the receiver has unpacked it, and the sender waits for
that before it packs into b again. So the pack of one chunk overlaps the unpack of the other,
as over a socket, but no byte is copied through the kernel.

NOTE: x86 makes stores visible in program order, so a flag written after a finished copy is
never seen before the copied bytes; elsewhere (ARM) that needs fences, so `supported()` is
x86 only and other hosts use the socket. A peer silent for `WAIT_TIMEOUT_S` fails the
transfer (the pool rolls back); until then its partners wait.
NOTE: tokens are unique per (migration, piece, chunk), so a flag left over from an earlier
migration never matches.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable

import torch

READY, DONE = 0, 2  # flag words: ready[0..1], done[0..1]
# A peer that does not answer within this many seconds is taken for dead.
WAIT_TIMEOUT_S = 60.0


class StagingTimeout(RuntimeError):
    """A peer did not hand a chunk over (or take it) in time."""


def _map(pid: int, fd: int, elems: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.from_file(f"/proc/{pid}/fd/{fd}", shared=True, size=elems, dtype=dtype)


def _memfd(name: str, nbytes: int) -> int:
    fd = os.memfd_create(name)
    os.ftruncate(fd, nbytes)
    return fd


def token_of(migration: int, piece: int, chunk: int) -> int:
    """The flag value naming chunk `chunk` of piece `piece` of migration `migration`."""
    return (migration << 36) | (piece << 20) | (chunk + 1)


class SharedStaging:
    """This device's staging buffers and flags in shared memory, and its peers' mapped."""

    def __init__(self, elems: int, dtype: torch.dtype) -> None:
        self.elems = elems
        self.dtype = dtype
        self.fd = _memfd("nitsum-kv-staging", 2 * elems * dtype.itemsize)
        self.flag_fd = _memfd("nitsum-kv-flags", 4 * 8)
        self.buffers = _map(os.getpid(), self.fd, 2 * elems, dtype).view(2, elems)
        self.flags = _map(os.getpid(), self.flag_fd, 4, torch.int64)
        self.peers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._next = 0  # the buffer the next put uses

    @staticmethod
    def supported() -> bool:
        """Linux (memfd, /proc) on x86, whose in-order stores the flag hand-off relies on."""
        return (
            hasattr(os, "memfd_create")
            and os.path.isdir("/proc/self/fd")
            and platform.machine().lower() in ("x86_64", "amd64")
        )

    def handle(self) -> tuple[int, int, int]:
        """What a peer needs to map this device's staging: (pid, buffers fd, flags fd)."""
        return os.getpid(), self.fd, self.flag_fd

    def attach(self, handles: dict[int, tuple[int, int, int]]) -> None:
        """Map every peer's staging (at start-up: nothing is mapped on the switch path)."""
        for peer, (pid, fd, flag_fd) in handles.items():
            if pid != os.getpid():
                buffers = _map(pid, fd, 2 * self.elems, self.dtype).view(2, self.elems)
                self.peers[peer] = (buffers, _map(pid, flag_fd, 4, torch.int64))

    def reset(self) -> None:
        """Free both buffers. NOTE: only between migrations (no peer is reading them then)."""
        self.flags.zero_()
        self._next = 0

    def put_buffer(self) -> tuple[int, torch.Tensor]:
        """Sender: (index, buffer) to pack the next chunk into, once the receiver has taken
        what it last held."""
        b = self._next
        self._next ^= 1
        flags = self.flags
        _wait(lambda: int(flags[DONE + b]) == int(flags[READY + b]), "take a chunk")
        return b, self.buffers[b]

    def publish(self, b: int, token: int) -> None:
        """Sender: buffer `b` now holds chunk `token`."""
        self.flags[READY + b] = token

    def take(self, peer: int, token: int) -> tuple[int, torch.Tensor]:
        """Receiver: (index, buffer) of `peer`'s staging once it holds chunk `token`."""
        buffers, flags = self.peers[peer]
        found: list[int] = []

        def ready() -> bool:
            found[:] = [b for b in (0, 1) if int(flags[READY + b]) == token]
            return bool(found)

        _wait(ready, f"hand over a chunk from device {peer}")
        return found[0], buffers[found[0]]

    def release(self, peer: int, b: int, token: int) -> None:
        """Receiver: `peer`'s buffer `b` (chunk `token`) is unpacked; the sender may reuse it."""
        self.peers[peer][1][DONE + b] = token


def _wait(cond: Callable[[], bool], what: str) -> None:
    """Spin briefly, then poll with short sleeps (other devices may share the core)."""
    for _ in range(200):
        if cond():
            return
    deadline = time.monotonic() + WAIT_TIMEOUT_S
    while not cond():
        if time.monotonic() > deadline:
            raise StagingTimeout(f"a peer did not {what} within {WAIT_TIMEOUT_S:.0f}s")
        time.sleep(20e-6)
