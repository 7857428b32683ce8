"""The part of a plan (`reconfigure`) that falls on the devices one worker process serves."""

from __future__ import annotations

from dataclasses import dataclass, field

from nitsum.parallel.topology import GroupShape
from nitsum.worker.protocol import GroupPlan


class PlanRefused(ValueError):
    """The worker cannot take the part the plan gives it; nothing changed."""


@dataclass(frozen=True)
class Assignment:
    """Role, tiers and batch cap of a device's group; role None: in no group (idle)."""

    role: str | None = None
    tiers: list[str] = field(default_factory=list)
    accepts_background: bool = True
    max_batch: int | None = None


@dataclass
class LocalPlan:
    """A plan restricted to this process's devices, in worker ids.

    NOTE: every local device is in exactly one of `groups`: devices the plan leaves out become
    TP-1 groups of their own (idle for the router, but their requests are never lost).
    """

    groups: list[GroupShape]
    assignments: dict[int, Assignment]

    def max_batch(self, group: GroupShape) -> int | None:
        """The plan's batch cap of `group` (held by its leader's assignment)."""
        return self.assignments[group.leader].max_batch


def local_plan(device_ids: list[int], groups: list[GroupPlan]) -> LocalPlan:
    """The groups of `groups` that contain one of `device_ids`; PlanRefused when the plan
    puts a device in two groups, a group's `tp` · `pp` disagrees with its members, or a group
    mixes these devices with devices of another process."""
    mine = set(device_ids)
    out: list[GroupShape] = []
    assignments: dict[int, Assignment] = {}
    for g in groups:
        members = tuple(sorted(g.members))
        if not mine & set(members):
            continue
        if len(set(members)) != len(members) or g.tp * g.pp != len(members):
            raise PlanRefused(
                f"group {list(g.members)}: tp {g.tp} x pp {g.pp} != its {len(members)} members"
            )
        if not set(members) <= mine:
            raise PlanRefused(
                f"group {list(members)} spans devices of another worker process "
                f"(this one serves {sorted(mine)}): a group needs all its devices in one "
                "worker process, run `nitsum worker --devices N` (a host worker)"
            )
        for d in members:
            if d in assignments:
                raise PlanRefused(f"worker {d} is in more than one group of the plan")
            assignments[d] = Assignment(g.role, list(g.tiers), g.accepts_background, g.max_batch)
        out.append(GroupShape(members, g.tp, g.pp))
    for d in device_ids:
        if d not in assignments:
            assignments[d] = Assignment()
            out.append(GroupShape((d,)))
    return LocalPlan(sorted(out), assignments)  # NOTE: shapes sort by their members first
