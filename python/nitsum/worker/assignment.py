"""This worker's part of a plan (`reconfigure`), for a worker that runs TP 1 only."""

from __future__ import annotations

from dataclasses import dataclass, field

from nitsum.worker.protocol import Group

TP_NOT_WIRED = "TP switching not wired in this worker yet"


class PlanRefused(ValueError):
    """The worker cannot take the part the plan gives it; nothing changed."""


@dataclass(frozen=True)
class Assignment:
    """Role, tiers and batch cap of this worker's group; role None: in no group (idle)."""

    role: str | None = None
    tiers: list[str] = field(default_factory=list)
    accepts_background: bool = True
    max_batch: int | None = None


def assignment_for(worker_id: int, groups: list[Group]) -> Assignment:
    """The worker's assignment under `groups`; PlanRefused when it cannot follow it.

    NOTE: only a one-member TP-1 group (or no group) is accepted until the multi-device pool
    lands; the leader of a TP > 1 group will activate another warm context here instead.
    """
    mine = [g for g in groups if worker_id in g.members]
    if len(mine) > 1:
        raise PlanRefused(f"worker {worker_id} is in {len(mine)} groups of the plan")
    if not mine:
        return Assignment()
    g = mine[0]
    if g.tp != 1 or g.members != [worker_id]:
        raise PlanRefused(TP_NOT_WIRED)
    return Assignment(g.role, list(g.tiers), g.accepts_background, g.max_batch)
