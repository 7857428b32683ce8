"""Short spellings of the TP groups tests build pools and plans from (parallel/topology.py)."""

from __future__ import annotations

from nitsum.parallel.topology import GroupShape


def tp(*members: int) -> GroupShape:
    """One TP group of `members` (TP = their number)."""
    return GroupShape.tp_group(members)


def layout(*groups: tuple[int, ...]) -> list[GroupShape]:
    """A plan of TP groups, one per members tuple."""
    return [GroupShape.tp_group(g) for g in groups]
