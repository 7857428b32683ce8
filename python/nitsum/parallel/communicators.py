"""Communicator pool: every aligned TP group's collectives are created once, collectively, at
start-up.

For N devices and levels P the groups are the aligned blocks [k·p, …, k·p+p-1]
(O(N) groups, Flying Serving §4.3). Lookup by member tuple is O(1). After `freeze()` any
attempt to create a process group anywhere in the process raises, which is how tests prove
that switching never creates communicators.

What carries a group's collectives (parallel/collectives.py) is chosen once per pool
(`resolve_collectives`): a torch.distributed group ("dist": NCCL where each device process has
a GPU of its own, as on a real node; gloo) or buffers the members map ("shared": CUDA IPC
where device processes share a GPU, since NCCL refuses two ranks on one GPU; memory files
between CPU devices, 1.7-13x faster than gloo's sockets there (scripts/bench_collectives.py),
and the same code).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from nitsum.parallel import shared_memory
from nitsum.parallel.collectives import Collectives, ProcessGroupCollectives
from nitsum.parallel.shared_collectives import SharedCollectives
from nitsum.parallel.topology import TPTopology

COLLECTIVES = ("auto", "dist", "shared")


class GroupCreationForbidden(RuntimeError):
    """A process group was requested after start-up."""


def resolve_collectives(choice: str, device_type: str, devices_per_gpu: int = 1) -> str:
    """ "dist" or "shared" for `choice` (one of COLLECTIVES) on `device_type` devices, with
    `devices_per_gpu` device processes per GPU; ValueError for a choice that cannot run."""
    if choice not in COLLECTIVES:
        raise ValueError(f"collectives: one of {COLLECTIVES}, not {choice!r}")
    if devices_per_gpu < 1:
        raise ValueError(f"devices per GPU must be >= 1, not {devices_per_gpu}")
    shares_gpu = device_type == "cuda" and devices_per_gpu > 1
    if shares_gpu and choice == "dist":
        raise ValueError(
            f"{devices_per_gpu} device processes per GPU need shared collectives: NCCL "
            "refuses two ranks on one GPU"
        )
    if (shares_gpu or choice == "shared") and not shared_memory.supported():
        raise ValueError("shared collectives need Linux on x86-64 (memory files, /proc)")
    if choice == "auto":
        # NOTE: CPU devices share memory where the flag hand-off is safe (x86), as GPUs
        # that share a device must; a GPU of its own keeps NCCL.
        shares = shares_gpu or (device_type == "cpu" and shared_memory.supported())
        return "shared" if shares else "dist"
    return choice


def world_backend(device_type: str, kind: str) -> str:
    """The world process group's backend: NCCL only where it carries the collectives (each
    process has a GPU of its own); gloo otherwise (start-up exchanges, CPU tensors)."""
    return "nccl" if device_type == "cuda" and kind == "dist" else "gloo"


class Communicators:
    """Collectives by member tuple, created at construction on every rank."""

    # Communicators created in this process (process groups once `guard_group_creation`
    # ran; shared groups always).
    created = 0
    _frozen = False
    _original_new_group = None

    def __init__(
        self,
        topology: TPTopology,
        rank: int = 0,
        kind: str = "dist",
        device: torch.device | str = "cpu",
    ) -> None:
        if Communicators._frozen:
            raise GroupCreationForbidden("communicators are only created at start-up")
        self.kind = kind
        self.groups: dict[tuple[int, ...], Collectives] = {}
        shared: dict[tuple[int, ...], SharedCollectives] = {}
        # NOTE: new_group is collective: every rank must create every group, in the same order.
        for shape in topology.aligned_groups():
            members = shape.members
            if kind == "shared":
                if rank in members and len(members) > 1:
                    shared[members] = SharedCollectives(members, rank, device)
                continue
            group = dist.new_group(list(members))
            # NOTE: a rank outside `members` gets a non-member sentinel, not a group; it never
            # communicates in that group, so it keeps none.
            if isinstance(group, dist.ProcessGroup):
                self.groups[members] = ProcessGroupCollectives(group)
        if kind == "shared":
            self._attach(shared)
        Communicators._frozen = True

    def _attach(self, shared: dict[tuple[int, ...], SharedCollectives]) -> None:
        """Every rank's handles to every rank (one collective over the world group), then
        each group maps its members'."""
        mine = {members: comm.handle() for members, comm in shared.items()}
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        for members, comm in shared.items():
            comm.attach([everyone[m][members] for m in members])
            self.groups[members] = comm
            Communicators.created += 1

    def get(self, members: tuple[int, ...]) -> Collectives | None:
        """The collectives of `members` (this rank among them); None for a single device (no
        communication needed)."""
        if len(members) == 1:
            return None
        try:
            return self.groups[members]
        except KeyError:
            raise KeyError(
                f"no communicator for {members}: groups must be aligned blocks holding this rank"
            ) from None

    @classmethod
    def guard_group_creation(cls) -> None:
        """Count every process group this process creates, and refuse any after the pool's.

        NOTE: it wraps `torch.distributed.new_group` for the whole process, so only a
        process that is nothing but a device calls it (`pool/device_proc.py`'s entry
        point); that is how tests prove a TP switch never creates a communicator.
        """
        if cls._original_new_group is not None:
            return
        original = dist.new_group
        cls._original_new_group = original

        def guarded(*args: Any, **kwargs: Any) -> Any:
            if cls._frozen:
                raise GroupCreationForbidden("process groups are only created at start-up")
            cls.created += 1
            return original(*args, **kwargs)

        dist.new_group = guarded
