"""Shared collectives (parallel/shared_collectives.py) on CPU processes, and on processes that
share one GPU through CUDA IPC where there is one: the bits every member gets, tensors larger
than a slot, the cut a recording makes, a member's death; and the staging channel's
whole-tensor hand-off (parallel/shared_channel.py) that pipelines use."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
import torch
import torch.distributed as dist

from group_procs import run_group
from nitsum.parallel import capture_cuts
from nitsum.parallel.communicators import resolve_collectives, world_backend
from nitsum.parallel.shared_channel import SharedChannel
from nitsum.parallel.shared_collectives import SharedCollectives
from nitsum.parallel.shared_memory import PeerTimeout, supported

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not supported(), reason="shared memory needs Linux on x86-64"),
]

SLOT = 4096  # bytes: the tensors below need several rounds
# Where the members' memory lives: memory files, and one GPU's memory shared by CUDA IPC.
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _group(rank: int, world: int, slot: int = SLOT, device: str = "cpu") -> SharedCollectives:
    if device == "cuda":
        torch.cuda.set_device(0)  # NOTE: every member on the one GPU
    comm = SharedCollectives(tuple(range(world)), rank, device, slot)
    handles: list[Any] = [None] * world
    dist.all_gather_object(handles, comm.handle())
    comm.attach(handles)
    return comm


def _data(
    rank: int, shape: tuple[int, ...], dtype: torch.dtype, device: str = "cpu"
) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(shape, generator=g).to(dtype).to(device)


def _collectives(rank: int, world: int, device: str) -> dict[str, Any]:
    comm = _group(rank, world, device=device)
    out: dict[str, Any] = {}
    for dtype in (torch.float32, torch.bfloat16):
        x = _data(rank, (37, 41), dtype, device)  # 1517 elements: 2 or 1 rounds of a 4 KiB slot
        comm.all_reduce(x)
        x = x.cpu()
        ref = _data(0, (37, 41), dtype)
        for j in range(1, world):
            ref.add_(_data(j, (37, 41), dtype))  # member order, as every member sums
        out[f"reduce_{dtype}"] = torch.equal(x, ref)
    x = _data(rank, (5, 300), torch.float32, device)
    parts = [torch.empty_like(x) for _ in range(world)]
    comm.all_gather(parts, x)
    parts = [p.cpu() for p in parts]
    out["gather"] = all(
        torch.equal(p, _data(j, (5, 300), torch.float32)) for j, p in enumerate(parts)
    )
    send = _data(rank, (world, 700), torch.float32, device)  # 700 floats a block: 3 rounds
    recv = torch.empty_like(send)
    comm.all_to_all_single(recv, send)
    recv = recv.cpu()
    out["all_to_all"] = all(
        torch.equal(recv[j], _data(j, (world, 700), torch.float32)[rank]) for j in range(world)
    )
    # While a step is recorded the collective runs nothing: it hands its call to the cut.
    calls: list[Any] = []
    x = torch.full((10,), float(rank + 1), device=device)
    rounds = comm.stats["rounds"]
    with capture_cuts.cutting(calls.append):
        comm.all_reduce(x)
    out["cut_deferred"] = comm.stats["rounds"] == rounds and torch.equal(
        x.cpu(), torch.full((10,), float(rank + 1))
    )
    calls[0]()  # the replay's call
    out["cut_ran"] = torch.equal(x.cpu(), torch.full((10,), float(sum(range(1, world + 1)))))
    out["rounds"] = comm.stats["rounds"]
    dist.barrier()  # NOTE: no member frees its slots (exits) while another may read them
    return out


@pytest.mark.parametrize("device", DEVICES)
def test_collectives_give_every_member_the_same_bits(device):
    results = run_group(3, _collectives, device)
    assert sorted(results) == [0, 1, 2], results
    for rank, (status, value) in results.items():
        assert status == "ok", value
        assert all(v for k, v in value.items() if k != "rounds"), (rank, value)
    # fp32 reduce 6068 B: 2 rounds, bf16 3034 B: 1, gather 6000 B: 2, all-to-all 3 blocks of
    # 2800 B, 341 floats of each a round: 3, the cut's call: 1
    assert {v["rounds"] for _, v in results.values()} == {2 + 1 + 2 + 3 + 1}


def _dies(rank: int, world: int) -> float:
    comm = _group(rank, world)
    comm.all_reduce(torch.ones(4))
    if rank == 1:
        os._exit(0)  # gone without a word, mid-conversation
    t0 = time.monotonic()
    try:
        comm.all_reduce(torch.ones(4))
    except PeerTimeout:
        return time.monotonic() - t0
    return -1.0


def test_a_member_that_dies_fails_the_others_quickly():
    results = run_group(3, _dies)
    assert 1 not in results
    for rank in (0, 2):
        status, seconds = results[rank]
        assert status == "ok" and 0 <= seconds < 5.0, (rank, status, seconds)


def _channel(rank: int, world: int, device: str) -> bool:
    if device == "cuda":
        torch.cuda.set_device(0)
    ch = SharedChannel(rank, 1000, torch.float32, device)  # 4000 B: 2500 floats are 3 chunks
    handles: list[Any] = [None] * world
    dist.all_gather_object(handles, ch.handle())
    ch.attach(dict(enumerate(handles)))
    ok = True
    # Device 0 sends to 1 and 2 in turn (more messages than its two buffers, and the same
    # counts on both links: a stale flag for one receiver must not pass for the other's).
    for i, to in enumerate([1, 2, 1, 2, 2, 1]):
        if rank == 0:
            ch.send(to, _data(i, (50, 50), torch.float32, device))
        elif rank == to:
            got = torch.empty(50, 50, device=device)
            ch.recv(0, got)
            ok &= torch.equal(got.cpu(), _data(i, (50, 50), torch.float32))
    dist.barrier()  # NOTE: the sender keeps its buffers until the last chunk is taken
    return ok


@pytest.mark.parametrize("device", DEVICES)
def test_channel_hands_whole_tensors_over_in_chunks(device):
    results = run_group(3, _channel, device)
    assert results == {0: ("ok", True), 1: ("ok", True), 2: ("ok", True)}


def test_choice_of_collectives():
    assert resolve_collectives("auto", "cpu") == "shared"  # x86 Linux: this test's skipif
    assert resolve_collectives("dist", "cpu") == "dist"
    assert resolve_collectives("shared", "cpu") == "shared"
    assert resolve_collectives("auto", "cuda", 1) == "dist"
    assert resolve_collectives("auto", "cuda", 4) == "shared"
    assert world_backend("cuda", "dist") == "nccl"
    assert world_backend("cuda", "shared") == "gloo"
    assert world_backend("cpu", "dist") == "gloo"
    with pytest.raises(ValueError, match="NCCL refuses two ranks on one GPU"):
        resolve_collectives("dist", "cuda", 2)
    with pytest.raises(ValueError, match="one of"):
        resolve_collectives("nccl", "cpu")
    with pytest.raises(ValueError, match=">= 1"):
        resolve_collectives("auto", "cuda", 0)
