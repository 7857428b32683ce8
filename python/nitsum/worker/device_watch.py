"""A host worker watches its device processes: a dead one leaves the plan, then restarts.

Each poll (between engine steps, from the server loop) reports what changed:
- a device whose process died, or that missed a step's deadline and was killed for it
  (pool/step_deadline.py), is taken out of the engines at once (pool/device_loss.py);
  the server tells the router (`device_lost`), which resumes its requests on a live group;
- its process is started again with backoff (worker/supervise.py `Restarts`: a device that
  keeps crashing costs one attempt per `max_s`), and once it is up it serves again as a
  TP-1 group of its own; the server registers its id again.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from nitsum.pool.device_loss import lose_device, revive_device
from nitsum.worker.supervise import Restarts

if TYPE_CHECKING:
    from nitsum.pool.device_pool import DevicePool
    from nitsum.pool.pool_engine import PoolEngine

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LostDevice:
    """Worker id `device` lost its process; `request_ids`: the requests it took down."""

    device: int
    reason: str
    request_ids: list[str]


@dataclass
class DeviceEvents:
    """What changed since the last poll, in worker ids."""

    lost: list[LostDevice] = field(default_factory=list)
    back: list[int] = field(default_factory=list)  # restarted and serving again


class DeviceWatch:
    """Notices dead device processes of `pe.pool` and restarts them (worker ids from
    `first_id`)."""

    def __init__(self, pe: PoolEngine, pool: DevicePool, first_id: int, restarts: Restarts) -> None:
        self.pe, self.pool, self.first_id, self.restarts = pe, pool, first_id, restarts
        now = time.monotonic()
        for d in range(pool.num_devices):
            restarts.started(self._name(d), now)

    @staticmethod
    def _name(device: int) -> str:
        return f"device {device}"

    def poll(self, now: float | None = None) -> DeviceEvents:
        """Take newly dead devices out, start the restarts that are due, revive the ready."""
        now = time.monotonic() if now is None else now
        events = DeviceEvents()
        for d, code in self.pool.lost():
            dropped = lose_device(self.pe, d)
            why = self.pool.why.pop(d, None)  # killed for missing a step's deadline
            reason = f"device process exited with code {code}"
            if why is not None:
                reason = f"{why}; exit code {code}"
            events.lost.append(LostDevice(self.first_id + d, reason, dropped))
            self.restarts.exited(self._name(d), code, now)
        for name in self.restarts.due(now):
            d = int(name.split()[-1])
            log.warning("restarting device %d", d)
            self.pool.restart(d)
            self.restarts.started(name, now)
        for d, error in self.pool.started():
            if error is not None:
                log.error("device %d failed to restart: %s", d, error)
                self.restarts.exited(self._name(d), None, now)
                continue
            revive_device(self.pe, d)
            events.back.append(self.first_id + d)
        return events
