"""A group's collectives over buffers every member maps, synchronized by host flags.

Each member owns a buffer of two slots (parallel/shared_memory.py: a memory file on CPU
devices, CUDA IPC memory on GPUs) and one host flag word. A collective is one or more
*rounds*; in round s every member copies its part into its slot s % 2, finishes that copy
(`fence`), stores s in its flag, waits until every member's flag is at least s, and then
reads the members' slots s % 2 (a sum in member order for all-reduce, so every member gets
the same bits; its block of each for all-to-all; each whole for all-gather). A tensor larger
than a slot goes in several rounds.

NOTE: two slots need no second wait: a member writes slot s % 2 again only in round s + 2,
after every member stored s + 1, which each does only after its reads of round s are done
(its fence in round s + 1 waits for them on the device too).

This is how several device processes share one GPU (NCCL refuses two ranks on one GPU), and
it runs the same on CPU devices. The host takes part in every round, so a CUDA graph cannot
hold one: while a step is recorded, each collective hands its call to the recording's cut
(parallel/capture_cuts.py) instead of running.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from nitsum.parallel import capture_cuts
from nitsum.parallel.shared_memory import Handle, SharedBuffer, fence, open_shared, wait_for

# Bytes of one slot: large enough to move a step's activations in few rounds.
SLOT_BYTES = 8 << 20


class SharedCollectives:
    """One member's view of a group's shared slots and flags (`attach` maps the others')."""

    def __init__(
        self,
        members: tuple[int, ...],
        member: int,
        device: torch.device | str = "cpu",
        slot_bytes: int = SLOT_BYTES,
    ) -> None:
        self.members, self.index = members, members.index(member)
        self.device = torch.device(device)
        self.slot_bytes = slot_bytes - slot_bytes % 16  # every dtype's view stays aligned
        self._data = SharedBuffer(2 * self.slot_bytes, self.device)
        self._flag = SharedBuffer(64)  # a cache line: flags of members never share one
        self.slots: list[torch.Tensor] = []  # member j's two slots, (2, slot_bytes) uint8
        self.flags: list[np.ndarray] = []
        self.pids: dict[int, int] = {}
        self.round = 0
        self.stats = {"rounds": 0}

    def handle(self) -> tuple[Handle, Handle]:
        return self._data.handle, self._flag.handle

    def attach(self, handles: list[tuple[Handle, Handle]]) -> None:
        """Map every member's slots and flag (`handles` in member order; at start-up)."""
        me = self._data.handle.pid
        for device, (data, flag) in zip(self.members, handles, strict=True):
            mine = data.pid == me
            self.slots.append((self._data.tensor if mine else open_shared(data)).view(2, -1))
            words = self._flag.words() if mine else open_shared(flag).view(torch.int64)
            self.flags.append(words.numpy())
            if not mine:
                self.pids[device] = data.pid

    # -- the collectives ----------------------------------------------------------------------
    def all_reduce(self, x: torch.Tensor) -> None:
        self._call(lambda: self._all_reduce(x))

    def all_gather(self, parts: list[torch.Tensor], x: torch.Tensor) -> None:
        self._call(lambda: self._all_gather(parts, x))

    def all_to_all_single(self, recv: torch.Tensor, send: torch.Tensor) -> None:
        self._call(lambda: self._all_to_all(recv, send))

    def _call(self, run: Callable[[], None]) -> None:
        cut = capture_cuts.active()
        if cut is not None:
            cut(run)  # recording a step: the call runs at replay, between two graphs
        else:
            run()

    def _all_reduce(self, x: torch.Tensor) -> None:
        flat = _flat(x)
        for lo, hi in self._spans(flat.numel(), flat.element_size()):
            slots = self._round(flat[lo:hi])
            part = flat[lo:hi]
            part.copy_(slots[0])
            for s in slots[1:]:
                part.add_(s)

    def _all_gather(self, parts: list[torch.Tensor], x: torch.Tensor) -> None:
        flat = _flat(x)
        outs = [_flat(p) for p in parts]
        for lo, hi in self._spans(flat.numel(), flat.element_size()):
            for out, slot in zip(outs, self._round(flat[lo:hi]), strict=True):
                out[lo:hi].copy_(slot)

    def _all_to_all(self, recv: torch.Tensor, send: torch.Tensor) -> None:
        n = len(self.members)
        src, dst = _flat(send).view(n, -1), _flat(recv).view(n, -1)
        for lo, hi in self._spans(src.shape[1], src.element_size() * n):
            slots = self._round(src[:, lo:hi].reshape(-1))
            for j, slot in enumerate(slots):
                dst[j, lo:hi].copy_(slot.view(n, hi - lo)[self.index])

    # -- rounds -------------------------------------------------------------------------------
    def _spans(self, elems: int, bytes_per_elem: int) -> list[tuple[int, int]]:
        step = max(1, self.slot_bytes // bytes_per_elem)
        return [(lo, min(lo + step, elems)) for lo in range(0, max(elems, 1), step)]

    def _round(self, part: torch.Tensor) -> list[torch.Tensor]:
        """Publish `part` (flat, at most a slot) in this round's slot and return every
        member's slot of this round, viewed like `part`, once all have published."""
        self.round += 1
        self.stats["rounds"] += 1
        s, phase, nbytes = self.round, self.round % 2, part.numel() * part.element_size()
        mine = self.slots[self.index][phase, :nbytes].view(part.dtype)
        mine.copy_(part)
        fence(self.device)
        self.flags[self.index][0] = s
        flags = self.flags
        wait_for(lambda: all(f[0] >= s for f in flags), "join a collective", self.pids)
        return [slot[phase, :nbytes].view(part.dtype) for slot in self.slots]


def _flat(x: torch.Tensor) -> torch.Tensor:
    """`x` as one flat view (the collectives write in place, so no copy is allowed)."""
    if not x.is_contiguous():
        raise ValueError("shared collectives take contiguous tensors")
    return x.view(-1)
