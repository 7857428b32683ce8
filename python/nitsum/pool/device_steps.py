"""A device pool's steps: launched on a group's devices, collected by their deadline.

A step's deadline is pool/step_deadline.py's; a device that misses it is killed (SIGKILL, so
it cannot come back half-alive) and from then on is lost exactly like a crashed device
(`DevicePool.lost`, worker/device_watch.py). `DevicePool` (device_pool.py) is these plus
its processes and other commands.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

import torch

from nitsum.engine.step_inputs import StepInputs
from nitsum.pool.device_commands import DeviceCommand, Step
from nitsum.pool.kv_transfer import TransferFailed
from nitsum.pool.step_deadline import StepDeadline, is_stopped

log = logging.getLogger(__name__)


class DeviceError(RuntimeError):
    """A device process reported an error (its traceback is the message)."""


class Late(Exception):
    """A device did not answer by its deadline."""


class DeviceSteps:
    """Steps of groups on device processes, each answered through the device's pipe.

    NOTE: a device answers commands in order; a step still out when another command goes to
    one of its devices is drained first (`drain_steps`) and its outcome kept for its collect.
    """

    conns: list[Connection]
    procs: list[BaseProcess]
    deadline: StepDeadline
    # Steps launched and not collected: members -> (launched at, tokens); steps drained early
    # (another command had to reach a member): their replies or error.
    _steps: dict[tuple[int, ...], tuple[float, int]]
    _drained: dict[tuple[int, ...], Any]
    # Why a device was killed (it missed its step deadline), until it is reported lost.
    why: dict[int, str]

    def send_many(self, devices: tuple[int, ...] | list[int], cmd: DeviceCommand) -> None:
        raise NotImplementedError

    def _reply(self, device: int, until: float | None = None) -> Any:
        raise NotImplementedError

    def _gone(self, device: int) -> None:
        raise NotImplementedError

    def drain_steps(self, devices: tuple[int, ...] | list[int]) -> None:
        """Read the replies of the steps still out on any of `devices` (by their deadline)."""
        for members in [g for g in self._steps if set(g) & set(devices)]:
            try:
                self._drained[members] = self._step_replies(members)
            except (DeviceError, TransferFailed) as e:
                self._drained[members] = e

    def launch_step(self, members: tuple[int, ...], inputs: StepInputs) -> None:
        assert members not in self._steps and members not in self._drained, members
        self.send_many(members, Step(members, inputs))
        self._steps[members] = (time.monotonic(), len(inputs.input_ids))

    def collect_step(self, members: tuple[int, ...]) -> torch.Tensor:
        """Logits from the member that samples (TP rank 0 of the last stage; every member
        must be drained). DeviceError if a member failed, died or missed the step's deadline
        (then it is killed: `lost` reports it)."""
        drained = members in self._drained
        out = self._drained.pop(members) if drained else self._step_replies(members)
        if isinstance(out, Exception):
            raise out
        return next(r for r in out if r is not None)

    def step_ready(self, members: tuple[int, ...]) -> bool:
        """True when collecting the launched step of `members` would not wait."""
        return members in self._drained or all(self.conns[d].poll(0) for d in members)

    def wait_steps(self, groups: list[tuple[int, ...]], timeout_s: float) -> None:
        """Wait until a member of one of `groups` answers, at most `timeout_s`."""
        if any(g in self._drained for g in groups):
            return
        # NOTE: only pipes with nothing to read yet: a member that answered must not wake
        # this wait again while its peers work on.
        quiet = [c for g in groups for c in (self.conns[d] for d in g) if not c.poll(0)]
        if quiet:
            wait(quiet, max(0.0, timeout_s))

    def step_due(self, members: tuple[int, ...]) -> float:
        """When the launched step of `members` misses its deadline (monotonic seconds)."""
        t0, tokens = self._steps.get(members, (time.monotonic(), 0))
        return t0 + self.deadline.budget(members, tokens)

    def step_patience(self, members: tuple[int, ...]) -> float:
        """When the launched step of `members` is late enough that the other groups stop
        waiting on it (twice its expected time; half a second before anything is measured)."""
        t0, tokens = self._steps.get(members, (time.monotonic(), 0))
        expected = self.deadline.expected(members, tokens)
        return t0 + (2 * expected + 0.05 if expected > 0 else 0.5)

    def _step_replies(self, members: tuple[int, ...]) -> list[Any]:
        t0, tokens = self._steps[members]
        until = self.step_due(members)
        del self._steps[members]
        replies, error, late = [], None, []
        for d in members:  # NOTE: drain every member even after an error, or pipes desync
            try:
                replies.append(self._reply(d, until))
            except Late:
                late.append(d)
            except (DeviceError, TransferFailed) as e:
                error = error or e
        if late:
            self._kill_hung(late, until - t0)
            raise DeviceError(f"device {late[0]} missed its step deadline ({until - t0:.1f} s)")
        if error is not None:
            raise error
        self.deadline.observe(members, tokens, time.monotonic() - t0)
        return replies

    def _kill_hung(self, late: list[int], budget_s: float) -> None:
        """Kill the devices that missed a step deadline: the stopped ones, if any; the rest
        may only wait on them in a collective, so they get one more floor to answer."""
        stopped = [d for d in late if is_stopped(self.procs[d].pid)] or late
        for d in stopped:
            log.error("device %d missed its step deadline (%.1f s): killing it", d, budget_s)
            self.why[d] = f"device process hung: no step reply within {budget_s:.1f} s (killed)"
            with contextlib.suppress(OSError):
                os.kill(self.procs[d].pid, signal.SIGKILL)  # type: ignore[arg-type]
            self._gone(d)
        peers = [d for d in late if d not in stopped]
        if peers:
            self._kill_hung_peers(peers, budget_s + self.deadline.floor_s)

    def _kill_hung_peers(self, peers: list[int], budget_s: float) -> None:
        until = time.monotonic() + self.deadline.floor_s
        late = []
        for d in peers:
            try:
                self._reply(d, until)  # NOTE: drained; the group's step failed anyway
            except Late:
                late.append(d)
            except (DeviceError, TransferFailed):
                pass
        if late:
            self._kill_hung(late, budget_s)
