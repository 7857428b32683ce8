"""The router's plan as this worker follows it: its epoch, each device's part, and `reconfigure`.

The router sends a plan's `reconfigure` to every member device of this process; the server
handles messages between steps, so a plan is always applied at an iteration boundary. The
first copy of an epoch to arrive applies it; the other copies are answered from the answers
kept for recent epochs, without touching the engines again (docs/protocol.md).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from typing import Any

from nitsum.worker import protocol as proto
from nitsum.worker.assignment import Assignment, PlanRefused, local_plan
from nitsum.worker.backend import Backend
from nitsum.worker.protocol import ProtocolError

log = logging.getLogger(__name__)

Ack = tuple[bool, str | None, dict[str, float]]
KEPT_ACKS = 16  # answers of recent epochs, for the copies of a plan still on their way


class ActivePlan:
    """The plan `backend` runs: its `epoch` and each device's `assignments`."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.epoch = 0
        # Each device's part of the plan at `epoch`.
        self.assignments: dict[int, Assignment] = {d: Assignment() for d in backend.device_ids}
        self.acks: OrderedDict[int, Ack] = OrderedDict()  # epoch -> its answer

    def answer(self, device: int, msg: dict[str, Any]) -> proto.Reconfigured:
        """Apply a plan once per epoch; every copy (one per member device) gets one answer,
        also one that does not parse.

        NOTE: the first copy to arrive applies the plan; copies of the same epoch on the other
        devices' sockets are answered from `acks` without touching the engines again.
        """
        t0 = time.perf_counter()
        epoch = msg["epoch"] if isinstance(msg.get("epoch"), int) else -1
        ack = self.acks.get(epoch)
        if ack is None:
            ack = self._apply(msg, t0)
        ok, error, timings = ack
        return proto.Reconfigured(device, epoch, ok, error, timings)

    def _apply(self, msg: dict[str, Any], t0: float) -> Ack:
        try:
            plan_msg = proto.Reconfigure.from_wire(msg)
        except ProtocolError as e:
            log.warning("reconfigure refused: %s", e)
            return False, str(e), {"total": (time.perf_counter() - t0) * 1e3}
        epoch, groups = plan_msg.epoch, plan_msg.groups
        try:
            if epoch < self.epoch:
                raise PlanRefused(f"epoch {epoch} is older than the active epoch {self.epoch}")
            plan = local_plan(self.backend.device_ids, groups)
            timings = self.backend.reconfigure(plan)
            self.epoch, self.assignments = epoch, plan.assignments
            ack: Ack = (True, None, timings)
        except PlanRefused as e:
            log.warning("reconfigure to epoch %d refused: %s", epoch, e)
            ack = (False, str(e), {})
        except Exception as e:  # e.g. a device process failed: answer anyway, never hang
            log.exception("reconfigure to epoch %d failed", epoch)
            ack = (False, f"internal error: {type(e).__name__}: {e}", {})
        ack[2]["total"] = (time.perf_counter() - t0) * 1e3
        self.acks[epoch] = ack
        while len(self.acks) > KEPT_ACKS:
            self.acks.popitem(last=False)
        return ack
