"""Executes migration pieces on one device: aggregated into few large copies, read in place
within a host, double-buffered and pipelined over a process group.

Every device gets the same ordered list of pieces and acts on those it sends or receives.
Between CPU devices of one host, and between processes that share a GPU, the receiver copies
straight from the sender's pages, which it maps (pool/shared_kv.py: memory files, CUDA IPC):
one copy per byte, a strided copy per run of pages on CPU, one Triton launch per chunk on
CUDA. Otherwise aggregated and double-buffered over the world process group (gloo sockets on
CPU; NCCL between GPUs of their own, which moves peer to peer itself): pack a chunk while the
other is on the wire. Processes sharing a GPU have no such fallback (their world group is
gloo, which sends no CUDA tensors): they read in place or fail at start-up.

NOTE, why not a staging hand-off between the processes: pack into a staging buffer, then
unpack from it, is two copies of every byte, and on a CPU they barely overlapped (the
shared-memory staging of 2026-11 reached 17-53% of a memcpy; one copy per run, read in place,
reached 115% of the memcpy reference of scripts/bench_tp_switch.py on the same machine); on
one GPU shared by several processes the two copies cannot overlap at all (their kernels are
time-sliced), so staging would cap a move at half a device-to-device copy.
NOTE: processing pieces in one global order makes blocking point-to-point transfers
deadlock-free: the earliest unfinished piece always has both of its devices waiting on it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from nitsum.config import kv_heads_per_rank
from nitsum.parallel.shared_memory import PeerTimeout, fence
from nitsum.pool.faults import FaultPlan
from nitsum.pool.migration_plan import Piece
from nitsum.pool.shared_kv import SharedKV
from nitsum_kernels.kv_pack import copy_ref, pack_ref, slot_view, unpack_ref

# Transfer modes: "pipelined" (straight from the peer's mapped pages where it has them, else
# the socket), "pipelined_socket" (the process group even where pages are mapped: the
# benchmark's baseline), "per_page" (one message per page fragment: the naive baseline).
MODES = ("pipelined", "pipelined_socket", "per_page")
# One chunk: large enough to amortize a message or a launch, small enough to stay in cache.
CHUNK_BYTES = 8 << 20


class TransferFailed(RuntimeError):
    """A transfer broke before commit; the old layout stays valid."""


@dataclass
class TransferStats:
    bytes_sent: int = 0
    bytes_received: int = 0
    bytes_copied_locally: int = 0
    messages: int = 0
    direct_copies: int = 0  # of `messages`, the chunks copied straight from a peer's pages
    seconds: float = 0.0


def _chunks(piece: Piece, tokens_per_chunk: int) -> list[slice]:
    return [
        slice(i, min(i + tokens_per_chunk, piece.tokens))
        for i in range(0, piece.tokens, tokens_per_chunk)
    ]


class KVTransfer:
    """Moves KV between this device's pool storage and its peers."""

    CHUNK_BYTES = CHUNK_BYTES

    def __init__(
        self,
        storage: torch.Tensor,
        kv_heads: int,
        head_dim: int,
        device: int,
        chunk_bytes: int = CHUNK_BYTES,
        shared: SharedKV | None = None,
    ) -> None:
        """`shared`: every peer's pages mapped (pool/shared_kv.py; None: the socket only)."""
        self.storage = storage
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self.device = device
        self.chunk_bytes = chunk_bytes
        # NOTE: socket buffers are allocated once here, never on the switch path.
        elems = chunk_bytes // storage.element_size()
        self.pack, self.unpack, self.copy = pack_ref, unpack_ref, copy_ref
        if storage.is_cuda:  # one Triton launch per chunk instead of many gather/scatter ops
            from nitsum_kernels.kv_pack_triton import copy_triton, pack_triton, unpack_triton

            self.pack, self.unpack, self.copy = pack_triton, unpack_triton, copy_triton
        self.shared = shared
        self.buffers = [
            torch.empty(elems, dtype=storage.dtype, device=storage.device) for _ in range(2)
        ]

    def _local_heads(self, tp: int) -> int:
        """KV heads per token in this device's pages at TP `tp`."""
        return kv_heads_per_rank(self.kv_heads, tp)

    def view(self, tp: int, p: Piece) -> torch.Tensor:
        """The piece's layers of this device's storage as (layers, 2, slots, heads, hd) at TP
        `tp`."""
        view = slot_view(self.storage, self._local_heads(tp), self.head_dim)
        return view[p.layers(view.shape[0])]

    def _bytes_per_token(self, p: Piece) -> int:
        """Bytes one token of the piece moves: its layers, K and V, its heads."""
        layers = len(range(self.storage.shape[0])[p.layers(self.storage.shape[0])])
        return layers * 2 * p.heads * self.head_dim * self.storage.element_size()

    def _tokens_per_chunk(self, p: Piece) -> int:
        return max(1, self.chunk_bytes // self._bytes_per_token(p))

    def run(
        self,
        pieces: list[Piece],
        mode: str = "pipelined",
        faults: FaultPlan | None = None,
        migration: int = 0,
    ) -> TransferStats:
        """Run every piece this device takes part in.

        `faults` (tests) may fail a piece: both ends of it stop after the chunk it names,
        every other piece still completes (so no peer is left waiting), and then
        TransferFailed is raised so the caller rolls back. `migration`: a number the
        controller gives each migration, increasing (the same on every device): it names
        when a device's pages are ready to be read in place.
        """
        if mode not in MODES:
            raise ValueError(f"unknown transfer mode {mode!r}; one of {MODES}")
        if mode != "pipelined" and self.storage.is_cuda and dist.get_backend() == "gloo":
            # NOTE: device processes sharing a GPU: their world group is gloo, which sends no
            # CUDA tensors; they move KV in place only.
            raise ValueError(f"mode {mode!r} needs a world group that sends CUDA tensors (NCCL)")
        shared = self.shared if mode == "pipelined" else None
        if shared is not None:
            shared.ready(migration)
        stats = TransferStats()
        t0 = time.perf_counter()
        failed = False
        for index, piece in enumerate(pieces):
            if self.device not in (piece.src, piece.dst):
                continue
            stop = faults.stop_chunk(index) if faults is not None else None
            if piece.src_slots.device != self.storage.device:
                piece = replace(
                    piece,
                    src_slots=piece.src_slots.to(self.storage.device),
                    dst_slots=piece.dst_slots.to(self.storage.device),
                )
            peer = piece.dst if piece.src == self.device else piece.src
            if piece.src == piece.dst:
                self._local(piece, stats)
            elif shared is not None and peer in shared.peers:
                try:
                    failed |= not self._direct(piece, stats, stop, migration)
                except PeerTimeout as e:
                    raise TransferFailed(str(e)) from e
            elif mode == "per_page":
                self._per_page(piece, stats)
            else:
                failed |= not self._pipelined(piece, stats, stop)
        if shared is not None:
            # NOTE: the copies out of a peer's pages are done before this device replies: the
            # commit (after every reply) may free those pages.
            fence(self.storage.device)
        stats.seconds = time.perf_counter() - t0
        if failed:
            raise TransferFailed(f"transfer failed before commit ({faults})")
        return stats

    def _local(self, p: Piece, stats: TransferStats) -> None:
        """Same device: one copy between its own pages (old and new pages are disjoint)."""
        src, dst = self.view(p.src_tp, p), self.view(p.dst_tp, p)
        self.copy(src, p.src_slots, p.src_head, dst, p.dst_slots, p.dst_head, p.heads)
        stats.bytes_copied_locally += p.tokens * self._bytes_per_token(p)

    def _direct(self, p: Piece, stats: TransferStats, stop: int | None, migration: int) -> bool:
        """Both ends: the receiver copies chunk by chunk straight from the sender's mapped
        pages; the sender only counts what is read from it.

        Returns False when stopped early by an injected failure.
        """
        assert self.shared is not None
        chunks = _chunks(p, self._tokens_per_chunk(p))
        if stop is not None:
            chunks = chunks[:stop]
        per_token = self._bytes_per_token(p)
        if p.src == self.device:
            stats.bytes_sent += sum(c.stop - c.start for c in chunks) * per_token
            return stop is None
        source = self.shared.source(p.src, migration)
        src = slot_view(source, self._local_heads(p.src_tp), self.head_dim)[
            p.layers(source.shape[0])
        ]
        dst = self.view(p.dst_tp, p)
        for c in chunks:
            self.copy(src, p.src_slots[c], p.src_head, dst, p.dst_slots[c], p.dst_head, p.heads)
            stats.bytes_received += (c.stop - c.start) * per_token
            stats.messages += 1
            stats.direct_copies += 1
        return stop is None

    def _pipelined(self, p: Piece, stats: TransferStats, stop: int | None) -> bool:
        """Double-buffered: pack (or unpack) one chunk while the other is on the wire.

        Returns False when stopped early by an injected failure.
        """
        chunks = _chunks(p, self._tokens_per_chunk(p))
        if stop is not None:
            chunks = chunks[:stop]
        sending = p.src == self.device
        view = self.view(p.src_tp if sending else p.dst_tp, p)
        layers = view.shape[0]

        def elems(c: slice) -> int:
            return layers * 2 * (c.stop - c.start) * p.heads * self.head_dim

        pending: list[dist.Work | None] = [None, None]
        if not sending and chunks:
            pending[0] = dist.irecv(self.buffers[0][: elems(chunks[0])], p.src)
        for i, c in enumerate(chunks):
            buf = self.buffers[i % 2]
            if sending:
                work = pending[i % 2]
                if work is not None:
                    work.wait()  # the buffer is free again once its send is done
                    pending[i % 2] = None
                block = self.pack(view, p.src_slots[c], p.src_head, p.heads, buf)
                pending[i % 2] = dist.isend(buf[: block.numel()], p.dst)
                stats.bytes_sent += block.numel() * block.element_size()
            else:
                work = pending[i % 2]
                assert work is not None  # NOTE: the receive was posted a chunk ahead
                work.wait()
                pending[i % 2] = None  # NOTE: gloo work must be waited exactly once
                if i + 1 < len(chunks):
                    # Post the next receive before unpacking this one: transfer overlaps unpack.
                    nxt = self.buffers[(i + 1) % 2][: elems(chunks[i + 1])]
                    pending[(i + 1) % 2] = dist.irecv(nxt, p.src)
                n = elems(c)
                block = buf[:n].view(layers, 2, c.stop - c.start, p.heads, self.head_dim)
                self.unpack(view, p.dst_slots[c], p.dst_head, p.heads, block)
                stats.bytes_received += n * buf.element_size()
            stats.messages += 1
        for w in pending:
            if w is not None:
                w.wait()
        return stop is None

    def _per_page(self, p: Piece, stats: TransferStats) -> None:
        """Baseline: one message per (source page, layer, K/V) fragment, as pages lie in memory."""
        sending = p.src == self.device
        view = self.view(p.src_tp if sending else p.dst_tp, p)
        slots = p.src_slots if sending else p.dst_slots
        head = p.src_head if sending else p.dst_head
        src_tokens_per_page = self.storage.shape[3] // (self._local_heads(p.src_tp) * self.head_dim)
        src_pages = torch.div(p.src_slots, src_tokens_per_page, rounding_mode="floor")
        cuts = (torch.nonzero(src_pages[1:] != src_pages[:-1]).flatten() + 1).tolist()
        bounds = [0, *cuts, p.tokens]
        for a, b in zip(bounds[:-1], bounds[1:], strict=True):
            idx = slots[a:b]
            for layer in range(view.shape[0]):
                for kv in range(2):
                    if sending:
                        frag = view[layer, kv, idx, head : head + p.heads].contiguous()
                        dist.send(frag, p.dst)
                        stats.bytes_sent += frag.numel() * frag.element_size()
                    else:
                        frag = torch.empty(
                            b - a, p.heads, self.head_dim, dtype=view.dtype, device=view.device
                        )
                        dist.recv(frag, p.src)
                        view[layer, kv, :, head : head + p.heads].index_copy_(0, idx, frag)
                        stats.bytes_received += frag.numel() * frag.element_size()
                    stats.messages += 1
