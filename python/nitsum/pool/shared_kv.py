"""Every device's KV pages, mapped by the other device processes of its host, and the flags
that say when a device's pages may be read.

A KV move between two devices of one host is then one copy: the receiver reads the source
pages in place and writes its own (pool/kv_transfer.py), with no staging buffer and nothing
through the host. The pages live in memory files on CPU devices and in CUDA IPC memory where
processes share one GPU (parallel/shared_memory.py). GPUs of their own move KV over NCCL,
peer to peer: torch's CUDA IPC would open a context on every peer GPU in every process.

NOTE: at the start of migration m every device finishes its queued device work (`fence`: a
step's KV writes may still be in flight) and stores m in its flag; a receiver reads a source
only once that source's flag is m (migrations run one at a time, so a source's flag holds m
all through m). The source pages stay allocated and unwritten
until the commit, which comes after every device replied, and a receiver replies only once
its copies are done: so nothing writes a page while a peer reads it.
"""

from __future__ import annotations

import numpy as np
import torch

from nitsum.parallel.shared_memory import (
    WAIT_TIMEOUT_S,
    Handle,
    SharedBuffer,
    fence,
    open_shared,
    wait_for,
)


class SharedKV:
    """This device's KV storage (allocated in shareable memory) and its peers', mapped."""

    def __init__(self, memory: SharedBuffer, storage: torch.Tensor) -> None:
        self.memory = memory
        self.storage = storage
        self._flag = SharedBuffer(64)
        self.flag = self._flag.words().numpy()
        self.peers: dict[int, torch.Tensor] = {}
        self.flags: dict[int, np.ndarray] = {}
        self.pids: dict[int, int] = {}
        # A source not ready within this long fails the transfer (which rolls back).
        self.timeout_s = WAIT_TIMEOUT_S

    def handle(self) -> tuple[Handle, Handle]:
        """What a peer needs to map this device's pages: (storage, flag)."""
        return self.memory.handle, self._flag.handle

    def attach(self, handles: dict[int, tuple[Handle, Handle]]) -> None:
        """Map every peer's storage, shaped like this device's (every device of a pool has
        the same pages), and its flag. At start-up only."""
        for peer, (memory, flag) in handles.items():
            if memory.pid == self.memory.handle.pid:
                continue
            raw = open_shared(memory)
            if raw.device != self.storage.device:  # NOTE: one GPU's processes only
                raise RuntimeError(f"{self.storage.device} maps no pages of {raw.device}")
            self.peers[peer] = raw.view(self.storage.dtype).view(self.storage.shape)
            self.flags[peer] = open_shared(flag).view(torch.int64).numpy()
            self.pids[peer] = memory.pid

    def ready(self, migration: int) -> None:
        """This device's pages are written (its queued work done): peers may read them."""
        fence(self.storage.device)
        self.flag[0] = migration

    def source(self, peer: int, migration: int) -> torch.Tensor:
        """`peer`'s storage, once it is ready for `migration` (PeerTimeout: it never was, or
        its process is gone)."""
        flag = self.flags[peer]
        wait_for(
            lambda: flag[0] == migration,
            f"make its pages ready for migration {migration}",
            {peer: self.pids[peer]},
            self.timeout_s,
        )
        return self.peers[peer]
