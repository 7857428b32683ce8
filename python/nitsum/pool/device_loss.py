"""A device whose process died leaves a PoolEngine's plan; restarted, it comes back alone.

NOTE: a restarted device is a world of one (pool/device_proc.py `DeviceSpec.solo`): the old
world cannot be rejoined, so it serves only as its own TP-1 group (`PoolEngine.solo`: never
in a TP group, a binding or a pipeline with another device) until its host worker restarts.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from nitsum.parallel.topology import GroupShape

if TYPE_CHECKING:
    from nitsum.pool.pool_engine import PoolEngine

log = logging.getLogger(__name__)


def lose_device(pe: PoolEngine, device: int) -> list[str]:
    """Take the dead `device` out of `pe`: every request of a group or binding it was in is
    dropped without an answer (the caller hands them back to the router, which resumes them
    from the tokens they streamed), and the surviving members of those groups become TP-1
    groups of their own. Returns the ids dropped.

    NOTE: nothing is sent to any device: the dead one cannot answer, and the survivors'
    pages of the dropped requests are only bookkeeping in the controller.
    """
    pe.settle()  # NOTE: the lost device's step fails; every member's reply is drained
    hit = [e for g, e in pe.every_engine() if g.holds(device)]
    dropped = [rid for e in hit for rid in e.request_ids()]
    for rid in dropped:
        pe.abort(rid)  # NOTE: before the groups go: a binding over them is released first
    pe.solo.add(device)
    for group in [g for g in pe.engines if g.holds(device)]:
        pe.retire(pe.engines.pop(group))
        for m in group.members:
            if m != device:
                alone = GroupShape.tp_group((m,))
                pe.engines[alone] = pe.new_engine(alone)
    log.error(
        "device %d lost: dropped %d request(s) for the router to resume", device, len(dropped)
    )
    return dropped


def revive_device(pe: PoolEngine, device: int) -> None:
    """The restarted `device` serves again, as a TP-1 group of its own."""
    assert device in pe.solo and not any(g.holds(device) for g in pe.engines), device
    alone = GroupShape.tp_group((device,))
    pe.engines[alone] = pe.new_engine(alone)
    log.info("device %d is back (TP 1 only until its host worker restarts)", device)
