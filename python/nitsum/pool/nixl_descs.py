"""NIXL descriptors of a KV handoff: the byte ranges a piece (migration_plan.py) reads from
the sender's pages and writes into the receiver's.

A device's KV storage is one registered region (layers, 2, pages, page_elems) (kv/cache.py):
at TP p a slot holds `kv_heads_per_rank(H, p)` heads of head_dim elements, so the heads
[h, h + n) of slot s in (layer, K or V) are one contiguous range. Consecutive slots whose
heads are whole rows on both sides merge into one range, so a page moves as one descriptor
per layer and K/V when both sides hold all its heads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nitsum.config import kv_heads_per_rank
from nitsum.pool.migration_plan import Piece
from nitsum.pool.nixl_agent import Read


@dataclass(frozen=True)
class KVRegion:
    """Where a device's KV storage is, for a peer's descriptors (exchanged at rendezvous)."""

    agent: str  # the NIXL agent that registered it
    addr: int  # address of storage[0, 0, 0, 0]
    layers: int
    plane_bytes: int  # bytes of one (layer, K or V) plane: every page, scratch included
    itemsize: int
    kv_heads: int  # the model's
    head_dim: int
    mem: str = "DRAM"  # NIXL's memory type: DRAM (CPU) or VRAM (a GPU)
    dev: int = 0  # the GPU's index for VRAM

    def to_wire(self) -> dict[str, int | str]:
        return dict(self.__dict__)

    @classmethod
    def from_wire(cls, d: dict[str, int | str]) -> KVRegion:
        return cls(**d)  # type: ignore[arg-type]


def _runs(src: np.ndarray, dst: np.ndarray, merge: bool) -> tuple[np.ndarray, ...]:
    """(src start, dst start, length) of the runs of slots consecutive on both sides (each
    slot its own run when not `merge`)."""
    if len(src) == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    if merge:
        breaks = (np.diff(src) != 1) | (np.diff(dst) != 1)
        starts = np.concatenate(([0], np.nonzero(breaks)[0] + 1))
    else:
        starts = np.arange(len(src))
    lengths = np.diff(np.concatenate((starts, [len(src)])))
    return src[starts], dst[starts], lengths


def piece_rows(p: Piece, src: KVRegion, dst: KVRegion) -> tuple[np.ndarray, np.ndarray]:
    """Rows (address, bytes, device id) of `p` on the sender (`src`) and on the receiver (`dst`),
    pairwise of equal length, for every layer of the piece and K and V."""
    if (src.itemsize, src.kv_heads, src.head_dim) != (dst.itemsize, dst.kv_heads, dst.head_dim):
        raise ValueError(f"KV layouts differ: {src} vs {dst}")
    layers = np.arange(src.layers)[p.layers(src.layers)]
    s_heads = kv_heads_per_rank(src.kv_heads, p.src_tp)
    d_heads = kv_heads_per_rank(dst.kv_heads, p.dst_tp)
    head_bytes = src.head_dim * src.itemsize
    whole = p.heads == s_heads == d_heads
    s0, d0, n = _runs(p.src_slots.numpy(), p.dst_slots.numpy(), whole)
    planes = (layers[:, None] * 2 + np.arange(2)[None, :]).reshape(-1, 1)  # (layers*2, 1)
    s_addr = src.addr + planes * src.plane_bytes + (s0 * s_heads + p.src_head)[None, :] * head_bytes
    d_addr = dst.addr + planes * dst.plane_bytes + (d0 * d_heads + p.dst_head)[None, :] * head_bytes
    length = np.broadcast_to((n * p.heads * head_bytes)[None, :], s_addr.shape)

    def rows(addr: np.ndarray, dev: int) -> np.ndarray:
        cols = (addr.reshape(-1), length.reshape(-1), np.full(addr.size, dev))
        return np.stack(cols, axis=1).astype(np.uint64)

    return rows(s_addr, src.dev), rows(d_addr, dst.dev)


def plan_reads(pieces: list[Piece], regions: dict[int, KVRegion]) -> dict[int, list[Read]]:
    """The READs each receiving device runs for `pieces`: one per source agent, its rows in
    piece order. `regions`: device id (the pieces' src and dst) -> its region."""
    rows: dict[int, dict[str, tuple[list[np.ndarray], list[np.ndarray]]]] = {}
    for p in pieces:
        src, dst = regions[p.src], regions[p.dst]
        remote, local = piece_rows(p, src, dst)
        by_agent = rows.setdefault(p.dst, {})
        locals_, remotes = by_agent.setdefault(src.agent, ([], []))
        locals_.append(local)
        remotes.append(remote)
    mem_of = {r.agent: r.mem for r in regions.values()}
    return {
        d: [
            Read(agent, np.concatenate(loc), np.concatenate(rem), regions[d].mem, mem_of[agent])
            for agent, (loc, rem) in by_agent.items()
        ]
        for d, by_agent in rows.items()
    }
