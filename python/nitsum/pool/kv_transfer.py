"""Executes migration pieces on one device: aggregated, double-buffered, pipelined.

Every device gets the same ordered list of pieces and acts on those it sends or receives.
Between the devices of one host the chunks go through the sender's staging buffers, which
every peer maps (parallel/shared_channel.py: memory files between CPU devices, CUDA IPC
between GPUs, peer to peer over NVLink or PCIe, or within one GPU its processes share): the
receiver unpacks straight from them. Otherwise over the world process group (gloo sockets on
CPU; NCCL on CUDA, the fallback where IPC cannot map a peer).
NOTE: processing pieces in one global order makes blocking point-to-point transfers
deadlock-free: the earliest unfinished piece always has both of its devices waiting on it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from nitsum.config import kv_heads_per_rank
from nitsum.kernels.kv_pack import pack_ref, slot_view, unpack_ref
from nitsum.parallel.shared_channel import SharedChannel
from nitsum.parallel.shared_memory import PeerTimeout
from nitsum.pool.faults import FaultPlan
from nitsum.pool.migration_plan import Piece

# Transfer modes: "pipelined" (shared staging where both ends have it, else the socket),
# "pipelined_socket" (the process group even where memory is shared: the benchmark's
# baseline), "per_page" (one message per page fragment: the naive baseline).
MODES = ("pipelined", "pipelined_socket", "per_page")
# One staging buffer: large enough to amortize a message, small enough to stay in cache.
CHUNK_BYTES = 8 << 20


def token_of(migration: int, piece: int, chunk: int) -> int:
    """The staging flag value naming chunk `chunk` of piece `piece` of migration `migration`."""
    return (migration << 36) | (piece << 20) | (chunk + 1)


class TransferFailed(RuntimeError):
    """A transfer broke before commit; the old layout stays valid."""


@dataclass
class TransferStats:
    bytes_sent: int = 0
    bytes_received: int = 0
    bytes_copied_locally: int = 0
    messages: int = 0
    shm_messages: int = 0  # of `messages`, the chunks handed over through shared staging
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
        staging: SharedChannel | None = None,
    ) -> None:
        self.storage = storage
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self.device = device
        self.chunk_bytes = chunk_bytes
        # NOTE: staging buffers are allocated once here, never on the switch path.
        elems = chunk_bytes // storage.element_size()
        self.pack, self.unpack = pack_ref, unpack_ref
        if storage.is_cuda:  # one Triton launch per chunk instead of many gather/scatter ops
            from nitsum.kernels.kv_pack_triton import pack_triton, unpack_triton

            self.pack, self.unpack = pack_triton, unpack_triton
        self.staging = staging
        if staging is not None:  # the shared staging buffers serve the socket path too
            assert staging.elems == elems and staging.dtype == storage.dtype
            self.buffers = list(staging.buffers)
        else:
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

    def _tokens_per_chunk(self, p: Piece) -> int:
        layers = len(range(self.storage.shape[0])[p.layers(self.storage.shape[0])])
        per_token = layers * 2 * p.heads * self.head_dim * self.storage.element_size()
        return max(1, self.chunk_bytes // per_token)

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
        controller gives each migration (the same on every device), naming its chunks in
        shared memory.
        """
        if mode not in MODES:
            raise ValueError(f"unknown transfer mode {mode!r}; one of {MODES}")
        if self.staging is not None:
            self.staging.reset()
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
            elif mode == "pipelined" and self.staging is not None and peer in self.staging.peers:
                try:
                    failed |= not self._shared(piece, stats, stop, migration, index)
                except PeerTimeout as e:
                    raise TransferFailed(str(e)) from e
            elif mode == "per_page":
                self._per_page(piece, stats)
            else:
                failed |= not self._pipelined(piece, stats, stop)
        stats.seconds = time.perf_counter() - t0
        if failed:
            raise TransferFailed(f"transfer failed before commit ({faults})")
        return stats

    def _local(self, p: Piece, stats: TransferStats) -> None:
        """Same device: a gather + scatter, never a send."""
        src = self.view(p.src_tp, p)[:, :, :, p.src_head : p.src_head + p.heads]
        block = src.index_select(2, p.src_slots)
        unpack_ref(self.view(p.dst_tp, p), p.dst_slots, p.dst_head, p.heads, block)
        stats.bytes_copied_locally += block.numel() * block.element_size()

    def _shared(
        self, p: Piece, stats: TransferStats, stop: int | None, migration: int, index: int
    ) -> bool:
        """Double-buffered through the sender's shared staging: it packs chunk i + 1 into its
        other staging buffer while the receiver unpacks chunk i from the first.

        Returns False when stopped early by an injected failure.
        """
        assert self.staging is not None
        chunks = _chunks(p, self._tokens_per_chunk(p))
        if stop is not None:
            chunks = chunks[:stop]
        sending = p.src == self.device
        view = self.view(p.src_tp if sending else p.dst_tp, p)
        for i, c in enumerate(chunks):
            token = token_of(migration, index, i)
            if sending:
                b, buf = self.staging.put_buffer(p.dst)
                block = self.pack(view, p.src_slots[c], p.src_head, p.heads, buf)
                self.staging.publish(b, token)
                stats.bytes_sent += block.numel() * block.element_size()
            else:
                b, buf = self.staging.take(p.src, token)
                shape = (view.shape[0], 2, c.stop - c.start, p.heads, self.head_dim)
                block = buf[: math.prod(shape)].view(shape)
                self.unpack(view, p.dst_slots[c], p.dst_head, p.heads, block)
                self.staging.release(p.src, b, token)
                stats.bytes_received += block.numel() * block.element_size()
            stats.messages += 1
            stats.shm_messages += 1
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
