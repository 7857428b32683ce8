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
from nitsum.pool.step_deadline import StepDeadline, cpu_seconds, is_stopped

log = logging.getLogger(__name__)

# A late step is given its budget again, at most this many times, while one of its devices
# still computes (CPU time of at least BUSY of the step's wall time so far).
EXTENSIONS = 3
BUSY = 0.05


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
    # Each device's CPU seconds when its last step was launched.
    _cpu: dict[int, float]
    # Each launched step's deadline, and how often it was extended (`_extend`).
    _due: dict[tuple[int, ...], float]
    _extended: dict[tuple[int, ...], int]

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
        now, tokens = time.monotonic(), len(inputs.input_ids)
        self._steps[members] = (now, tokens)
        self._due[members] = now + self.deadline.budget(members, tokens)
        self._cpu.update({d: cpu_seconds(self.procs[d].pid) for d in members})

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
        return self._due.get(members, time.monotonic())

    def overdue(self, members: tuple[int, ...]) -> bool:
        """True once the launched step of `members` is past its deadline and its late devices
        do not compute (`_extend`); its collect then kills them."""
        if members not in self._steps or time.monotonic() < self._due[members]:
            return False
        late = [d for d in members if not self.conns[d].poll(0)]
        return not (late and self._extend(members, late))

    def step_patience(self, members: tuple[int, ...]) -> float:
        """When the launched step of `members` is late enough that the other groups stop
        waiting on it (1.5 times its expected time; half a second before any is measured)."""
        t0, tokens = self._steps.get(members, (time.monotonic(), 0))
        expected = self.deadline.expected(members, tokens)
        return t0 + (1.5 * expected + 0.05 if expected > 0 else 0.5)

    def _step_replies(self, members: tuple[int, ...]) -> list[Any]:
        t0, tokens = self._steps[members]
        until = self._due[members]
        got: dict[int, Any] = {}
        error: Exception | None = None
        waiting = list(members)
        while waiting:  # NOTE: drain every member even after an error, or pipes desync
            late = []
            for d in waiting:
                try:
                    got[d] = self._reply(d, until)
                except Late:
                    late.append(d)
                except (DeviceError, TransferFailed) as e:
                    error, got[d] = error or e, None
            waiting = late
            if not late:
                break
            if self._extend(members, late):
                until = self._due[members]
                continue
            expected = self.deadline.expected(members, tokens)
            log.error(
                "group %s: no step reply from %s within %.1f s (a step of %d tokens, %.2f s "
                "expected)",
                members, late, until - t0, tokens, expected,
            )  # fmt: skip
            self._forget(members)
            self._kill_hung(late, until - t0)
            raise DeviceError(f"device {late[0]} missed its step deadline ({until - t0:.1f} s)")
        self._forget(members)
        if error is not None:
            raise error
        self.deadline.observe(members, tokens, time.monotonic() - t0)
        return [got[d] for d in members]

    def _forget(self, members: tuple[int, ...]) -> None:
        del self._steps[members], self._due[members]
        self._extended.pop(members, None)

    def _extend(self, members: tuple[int, ...], late: list[int]) -> bool:
        """Give the late step of `members` its budget again if one of its `late` devices
        still computes (`_working`), at most `EXTENSIONS` times; False: they count as hung."""
        t0, tokens = self._steps[members]
        n = self._extended.get(members, 0)
        if n >= EXTENSIONS or not self._working(late, t0):
            return False
        self._extended[members] = n + 1
        self._due[members] = time.monotonic() + self.deadline.budget(members, tokens)
        log.warning(
            "group %s: a step of %d tokens is past its deadline (%.2f s expected) but %s "
            "still compute: extended (%d of %d)",
            members, tokens, self.deadline.expected(members, tokens), late, n + 1, EXTENSIONS,
        )  # fmt: skip
        return True

    def _working(self, late: list[int], t0: float) -> bool:
        """True if none of `late` is stopped and one of them spent CPU time on the step (at
        least `BUSY` of its wall time): a slow device, not a hung one."""
        pids = [self.procs[d].pid for d in late]
        if any(is_stopped(p) for p in pids):
            return False
        wall = time.monotonic() - t0
        spent = [cpu_seconds(self.procs[d].pid) - self._cpu.get(d, 0.0) for d in late]
        return any(s >= BUSY * wall for s in spent)

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
