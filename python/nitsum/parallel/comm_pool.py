"""Communicator pool: every aligned TP group is created once, collectively, at start-up.

For N devices and levels P the groups are the aligned blocks [k·p, …, k·p+p-1]
(O(N) groups, Flying Serving §4.3). Lookup by member tuple is O(1). After `freeze()` any
attempt to create a process group anywhere in the process raises, which is how tests prove
that switching never creates communicators.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from nitsum.parallel.topology import TPTopology


class GroupCreationForbidden(RuntimeError):
    """A process group was requested after start-up."""


class CommPool:
    """Process groups by member tuple, created at construction on every rank."""

    # Counted across the whole process once `guard_group_creation` ran.
    created = 0
    _frozen = False
    _original_new_group = None

    def __init__(self, topology: TPTopology) -> None:
        self.groups: dict[tuple[int, ...], dist.ProcessGroup] = {}
        # NOTE: new_group is collective: every rank must create every group, in the same order.
        for members in topology.aligned_groups():
            group = dist.new_group(list(members))
            # NOTE: a rank outside `members` gets a non-member sentinel, not a group; it never
            # communicates in that group, so it keeps none.
            if isinstance(group, dist.ProcessGroup):
                self.groups[members] = group
        CommPool._frozen = True

    def get(self, members: tuple[int, ...]) -> dist.ProcessGroup | None:
        """The group of `members` (this rank among them); None for a single device (no
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
