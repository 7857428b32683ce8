"""A device's two staging buffers, mapped by every peer of its host: the double-buffered
hand-off of pipeline activations (parallel/pipeline.py) between device processes whose
collectives are shared, with no byte copied through the kernel or a socket.

A sender packs one chunk after another into its own two buffers; the receiver unpacks each
straight from its mapping of them (parallel/shared_memory.py: memory files on CPU devices,
CUDA IPC on GPUs). Four host flag words carry the hand-off: `ready[b] = token` once buffer b
holds chunk `token`, `done[b] = token` once the receiver has unpacked it, and the sender waits
for that before it packs into b again. So the pack of one chunk overlaps the unpack of the
other. The flags are written only after the device work they announce is finished (`fence`).

NOTE: a chunk's token is its receiver and its count on the link (sender, receiver), which both
ends keep, so a flag left over from an earlier hand-off, to this receiver or another, never
matches. A peer silent for `WAIT_TIMEOUT_S`, or
whose process is gone, fails the hand-off (`PeerTimeout`), and with it the step.
"""

from __future__ import annotations

import numpy as np
import torch

from nitsum.parallel.shared_memory import Handle, SharedBuffer, fence, open_shared, wait_for

READY, DONE = 0, 2  # flag words: ready[0..1], done[0..1]


class SharedChannel:
    """Device `me`'s two staging buffers of `elems` elements and its flags, and its peers'
    mapped (`attach`)."""

    def __init__(
        self, me: int, elems: int, dtype: torch.dtype, device: torch.device | str = "cpu"
    ) -> None:
        self.me = me
        self.elems = elems
        self.dtype = dtype
        self.device = torch.device(device)
        self._data = SharedBuffer(2 * elems * dtype.itemsize, self.device)
        self._flags = SharedBuffer(4 * 8)
        self.buffers = self._data.tensor.view(dtype).view(2, elems)
        self.flags = self._flags.words().numpy()
        self.peers: dict[int, tuple[torch.Tensor, np.ndarray]] = {}
        self.pids: dict[int, int] = {}
        self._next = 0  # the buffer the next put uses
        # Chunks sent to / taken from each peer (their tokens).
        self.sent: dict[int, int] = {}
        self.taken: dict[int, int] = {}

    def handle(self) -> tuple[Handle, Handle]:
        """What a peer needs to map this device's staging: (buffers, flags)."""
        return self._data.handle, self._flags.handle

    def attach(self, handles: dict[int, tuple[Handle, Handle]]) -> None:
        """Map every peer's staging (at start-up: nothing is mapped on a step or switch path)."""
        for peer, (data, flags) in handles.items():
            if data.pid != self._data.handle.pid:
                buffers = open_shared(data).view(self.dtype).view(2, self.elems)
                self.peers[peer] = (buffers, open_shared(flags).view(torch.int64).numpy())
                self.pids[peer] = data.pid

    def put_buffer(self, peer: int) -> tuple[int, torch.Tensor]:
        """Sender: (index, buffer) to pack the next chunk for `peer` into, once the receiver
        has taken what it last held."""
        b = self._next
        self._next ^= 1
        flags = self.flags
        wait_for(lambda: flags[DONE + b] == flags[READY + b], "take a chunk", self._pid(peer))
        return b, self.buffers[b]

    def publish(self, b: int, token: int) -> None:
        """Sender: buffer `b` now holds chunk `token` (once this device's pack is done)."""
        fence(self.device)
        self.flags[READY + b] = token

    def take(self, peer: int, token: int) -> tuple[int, torch.Tensor]:
        """Receiver: (index, buffer) of `peer`'s staging once it holds chunk `token`."""
        buffers, flags = self.peers[peer]
        found: list[int] = []

        def ready() -> bool:
            found[:] = [b for b in (0, 1) if flags[READY + b] == token]
            return bool(found)

        wait_for(ready, f"hand over a chunk from device {peer}", self._pid(peer))
        return found[0], buffers[found[0]]

    def release(self, peer: int, b: int, token: int) -> None:
        """Receiver: `peer`'s buffer `b` (chunk `token`) is unpacked (once this device's unpack
        is done); the sender may reuse it."""
        fence(self.device)
        self.peers[peer][1][DONE + b] = token

    def _pid(self, peer: int) -> dict[int, int]:
        return {peer: self.pids[peer]} if peer in self.pids else {}

    # -- whole tensors, chunk by chunk ---------------------------------------------------------
    def send(self, peer: int, x: torch.Tensor) -> None:
        """Hand `x` to `peer` (which calls `recv` with a tensor of the same size), a chunk of
        at most `elems` at a time; returns once the last chunk is staged (`x` may be reused)."""
        flat = x.reshape(-1)
        for lo in range(0, max(flat.numel(), 1), self.elems):
            part = flat[lo : lo + self.elems]
            self.sent[peer] = self.sent.get(peer, 0) + 1
            b, buf = self.put_buffer(peer)
            buf[: part.numel()].copy_(part)
            self.publish(b, _token(peer, self.sent[peer]))

    def recv(self, peer: int, out: torch.Tensor) -> None:
        """Fill `out` (contiguous) with what `peer` sends next."""
        flat = out.view(-1)
        for lo in range(0, max(flat.numel(), 1), self.elems):
            part = flat[lo : lo + self.elems]
            self.taken[peer] = self.taken.get(peer, 0) + 1
            token = _token(self.me, self.taken[peer])
            b, buf = self.take(peer, token)
            part.copy_(buf[: part.numel()])
            self.release(peer, b, token)


def _token(receiver: int, count: int) -> int:
    return (receiver + 1) << 40 | count
