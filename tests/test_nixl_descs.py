"""NIXL descriptors of a KV handoff (pool/nixl_descs.py), READ for real between NIXL agents
of this process (pool/nixl_endpoint.py): a sequence's KV in a TP-2 group's pages lands in a
TP-1 group's pages (and back), byte for byte what the wire layout path (kv_wire.py) moves,
for every layer and K and V; whole-row pages merge into one descriptor per page run."""

from __future__ import annotations

import pytest
import torch

from nitsum.config import kv_heads_per_rank
from nitsum.parallel.topology import GroupShape
from nitsum.pool.migration_plan import Placement, plan_pieces
from nitsum.pool.nixl_agent import NixlUnavailable, load_nixl
from nitsum.pool.nixl_descs import KVRegion, piece_rows, plan_reads
from nitsum_kernels.kv_pack import slot_view

LAYERS, KV_HEADS, HEAD_DIM, PAGE_TOKENS, PAGES = 3, 4, 8, 4, 12


def _storage(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    page_elems = PAGE_TOKENS * KV_HEADS * HEAD_DIM
    return torch.randn(LAYERS, 2, PAGES + 1, page_elems, generator=g)


def _tokens_of(storages: dict[int, torch.Tensor], at: Placement, tokens: int) -> torch.Tensor:
    """(layers, 2, tokens, KV_HEADS, HEAD_DIM): the sequence's KV gathered from `at`."""
    out = torch.empty(LAYERS, 2, tokens, KV_HEADS, HEAD_DIM)
    heads = kv_heads_per_rank(KV_HEADS, at.tp)
    per_page = PAGE_TOKENS * KV_HEADS // heads
    slots = torch.tensor([at.pages[t // per_page] * per_page + t % per_page for t in range(tokens)])
    for r, d in enumerate(at.shape.members):
        view = slot_view(storages[d], heads, HEAD_DIM)
        out[:, :, :, r * heads : (r + 1) * heads] = view[:, :, slots]
    return out


def _region(agent: str, t: torch.Tensor) -> KVRegion:
    return KVRegion(agent, t.data_ptr(), LAYERS, t[0, 0].numel() * 4, 4, KV_HEADS, HEAD_DIM)


def test_whole_row_pages_merge_into_one_descriptor_per_run_of_pages() -> None:
    src, dst = _storage(0), _storage(1)
    old = Placement(GroupShape((0,)), (3, 4, 9))
    new = Placement(GroupShape((1,)), (5, 6, 7))
    (p,) = plan_pieces(KV_HEADS, LAYERS, PAGE_TOKENS, 10, old, new)
    remote, local = piece_rows(p, _region("a", src), _region("b", dst))
    # Source slots 12..19 and 36..37 against destination slots 20..29: two runs per plane.
    assert remote.shape == local.shape == (LAYERS * 2 * 2, 3)
    assert remote[:2, 1].tolist() == [8 * KV_HEADS * HEAD_DIM * 4, 2 * KV_HEADS * HEAD_DIM * 4]
    assert int(local[:, 1].sum()) == LAYERS * 2 * 10 * KV_HEADS * HEAD_DIM * 4


@pytest.mark.parametrize("old_tp, new_tp", [(2, 1), (1, 2), (2, 2)])
def test_a_nixl_read_of_the_planned_descriptors_moves_the_sequence_byte_exact(
    old_tp: int, new_tp: int
) -> None:
    try:
        load_nixl()
    except NixlUnavailable as e:
        pytest.skip(str(e))
    from nitsum.pool.nixl_endpoint import KVEndpoint

    tokens = 13
    storages = {d: _storage(d) for d in range(4)}
    old = Placement(GroupShape.tp_group(tuple(range(old_tp))), (7, 2, 5, 11))
    new = Placement(GroupShape.tp_group(tuple(range(2, 2 + new_tp))), (1, 8, 3, 4))
    want = _tokens_of(storages, old, tokens)
    assert not torch.equal(_tokens_of(storages, new, tokens), want)
    members = (*old.shape.members, *new.shape.members)
    ends = {d: KVEndpoint(storages[d], KV_HEADS, HEAD_DIM) for d in members}
    try:
        for d, e in ends.items():
            e.connect([o.info()[0] for k, o in ends.items() if k != d])
        pieces = plan_pieces(KV_HEADS, LAYERS, PAGE_TOKENS, tokens, old, new)
        reads = plan_reads(pieces, {d: e.region for d, e in ends.items()})
        moved = sum(ends[d].read(rs, timeout_s=30) for d, rs in reads.items())
        assert moved == LAYERS * 2 * tokens * KV_HEADS * HEAD_DIM * 4  # each head once
        assert torch.equal(_tokens_of(storages, new, tokens), want)
    finally:
        for e in ends.values():
            e.agent.close()
