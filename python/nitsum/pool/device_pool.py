"""Controller side of a pool of device processes (CPU processes in tests, GPUs in production)."""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import pickle
import time
from dataclasses import replace
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

import torch

from nitsum.engine.engine_config import EngineConfig
from nitsum.kv.host_tier import PageCopies
from nitsum.kv.swap_copier import SwapProgress
from nitsum.pool.device_commands import (
    DeviceCommand,
    KvIn,
    KvOut,
    Migrate,
    NixlConnect,
    NixlOpen,
    NixlRead,
    Reply,
    Stop,
    SwapPoll,
    SwapStart,
)
from nitsum.pool.device_proc import DeviceSpec, ModelSource, device_main
from nitsum.pool.device_steps import DeviceError, DeviceSteps, Late
from nitsum.pool.faults import FaultPlan
from nitsum.pool.kv_transfer import TransferFailed, TransferStats
from nitsum.pool.migration_plan import Piece
from nitsum.pool.nixl_agent import Read
from nitsum.pool.nixl_descs import KVRegion
from nitsum.pool.step_deadline import StepDeadline
from nitsum.ports import free_port

log = logging.getLogger(__name__)


class DevicePool(DeviceSteps):
    """Starts one process per device and sends them commands.

    NOTE: commands to one device are answered in order, so a caller may send to several
    devices first and collect later; that is how groups run their steps concurrently.
    """

    def __init__(
        self,
        num_devices: int,
        source: ModelSource,
        ecfg: EngineConfig,
        num_pages: int,
        levels: tuple[int, ...] | None = None,
        start_timeout: float = 300.0,
    ) -> None:
        """`ecfg.device_step_timeout_s`: the floor of a step's deadline (pool/step_deadline.py);
        a device that misses its deadline is killed and lost like a crashed one."""
        if ecfg.device.startswith("cuda") and 1 < ecfg.devices_per_gpu < num_devices:
            raise ValueError(
                f"{num_devices} devices at {ecfg.devices_per_gpu} per GPU would span GPUs: "
                "several processes per GPU make one GPU a pool (one process per GPU on a node)"
            )
        self.num_devices = num_devices
        threads = max(1, (os.cpu_count() or 1) // num_devices)
        # NOTE: the PoolEngine derives its topology from the same candidates (`self.levels`).
        levels = levels or ecfg.tp_levels
        self.levels = levels
        spec = DeviceSpec(
            num_devices, levels, ecfg, num_pages, f"tcp://127.0.0.1:{free_port()}", threads
        )
        self.spec, self.source = spec, source
        self.conns: list[Connection] = []
        self.procs: list[BaseProcess] = []
        for d in range(num_devices):
            proc, parent = self._spawn(d, spec)
            self.conns.append(parent)
            self.procs.append(proc)
        # Devices whose process died (until a restart is up) and those not yet reported.
        self.down: set[int] = set()
        self._unreported: list[int] = []
        # Restarted processes not ready yet: device -> (process, pipe).
        self.starting: dict[int, tuple[BaseProcess, Connection]] = {}
        self.contexts: list[list[tuple[int, ...]]] = []
        self._migrations = 0
        self.deadline = StepDeadline(ecfg.device_step_timeout_s)
        self._steps, self._drained, self.why, self._cpu = {}, {}, {}, {}  # device_steps.py
        self._due, self._extended = {}, {}
        for d, conn in enumerate(self.conns):
            if not conn.poll(start_timeout):
                self.close()
                raise DeviceError(f"device {d} did not start within {start_timeout:.0f}s")
            self.contexts.append(self._reply(d))

    def _spawn(self, device: int, spec: DeviceSpec) -> tuple[BaseProcess, Connection]:
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=device_main, args=(device, spec, self.source, child), daemon=True)
        proc.start()
        child.close()  # NOTE: only the device holds its end, so its death is EOF here
        log.info("device %d started (pid %s)", device, proc.pid)
        return proc, parent

    # -- device deaths and restarts (worker/device_watch.py drives them) -----------------------
    def _gone(self, device: int) -> None:
        """`device` is dead: its pipe broke or its process exited (reaped before reporting)."""
        if device not in self.down:
            self.procs[device].join(timeout=5)  # NOTE: EOF comes a moment before the exit
            self.down.add(device)
            self._unreported.append(device)

    def lost(self) -> list[tuple[int, int | None]]:
        """(device, exit code) of each device that died since the last call."""
        for d, proc in enumerate(self.procs):
            if d not in self.down and d not in self.starting and not proc.is_alive():
                self._gone(d)
        out = [(d, self.procs[d].exitcode) for d in self._unreported]
        self._unreported = []
        return out

    def restart(self, device: int) -> None:
        """Start a dead device's process again, alone (`DeviceSpec.solo`: the old world
        cannot be rejoined); `started` tells when it is ready."""
        assert device in self.down and device not in self.starting, device
        spec = replace(self.spec, init_method=f"tcp://127.0.0.1:{free_port()}", solo=True)
        self.starting[device] = self._spawn(device, spec)

    def started(self) -> list[tuple[int, str | None]]:
        """(device, None) for each restarted device now serving; (device, why) for each
        restart that failed (its process is gone: restart it again later)."""
        out: list[tuple[int, str | None]] = []
        for d, (proc, conn) in list(self.starting.items()):
            try:
                if not conn.poll(0):
                    if proc.is_alive():
                        continue
                    raise EOFError(f"exited with code {proc.exitcode}")
                reply: Reply = pickle.loads(conn.recv_bytes())
            except (EOFError, OSError) as e:
                reply = Reply("error", f"{type(e).__name__}: {e}")
            del self.starting[d]
            if reply.status != "ok":
                proc.join(timeout=5)
                out.append((d, str(reply.value).strip().splitlines()[-1]))
                continue
            self.procs[d], self.conns[d] = proc, conn
            self.contexts[d] = reply.value
            self.down.discard(d)
            out.append((d, None))
        return out

    # -- messaging ---------------------------------------------------------------------------
    def send(self, device: int, cmd: DeviceCommand) -> None:
        self.send_many((device,), cmd)

    def send_many(self, devices: tuple[int, ...] | list[int], cmd: DeviceCommand) -> None:
        """Send one command to every device of `devices`, or to none: DeviceError when one of
        them is gone (its process died), before anything is sent, so no live device starts a
        collective or a transfer its dead peer will never join."""
        dead = [d for d in devices if d in self.down or not self.procs[d].is_alive()]
        for d in dead:
            self._gone(d)
        if dead:
            raise DeviceError(f"device {dead[0]} is gone (its process exited)")
        self.drain_steps(devices)  # NOTE: a step still out answers first: replies keep order
        data = pickle.dumps(cmd)  # pickled once for the whole group
        for d in devices:
            try:
                self.conns[d].send_bytes(data)
            except OSError as e:
                self._gone(d)
                raise DeviceError(f"device {d} is gone: {e}") from e

    def _reply(self, device: int, until: float | None = None) -> Any:
        """`device`'s next reply; `Late` if none came by `until` (monotonic seconds)."""
        try:
            left = None if until is None else max(0.0, until - time.monotonic())
            if left is not None and not self.conns[device].poll(left):
                raise Late(device)
            raw = self.conns[device].recv_bytes()
        except (EOFError, OSError) as e:
            self._gone(device)
            raise DeviceError(f"device {device} is gone: {type(e).__name__}") from e
        reply: Reply = pickle.loads(raw)
        if reply.status == "transfer_failed":
            raise TransferFailed(reply.value)
        if reply.status != "ok":
            raise DeviceError(f"device {device}: {reply.value}")
        return reply.value

    def call(self, device: int, cmd: DeviceCommand) -> Any:
        """Send `cmd` to `device` and wait for its value."""
        self.send(device, cmd)
        return self._reply(device)

    # -- steps -------------------------------------------------------------------------------
    def _replies(self, members: tuple[int, ...]) -> list[Any]:
        """Every member's reply, in order; the first DeviceError or TransferFailed once all
        are drained."""
        replies, error = [], None
        for d in members:  # NOTE: drain every member even after an error, or pipes desync
            try:
                replies.append(self._reply(d))
            except (DeviceError, TransferFailed) as e:
                error = error or e
        if error is not None:
            raise error
        return replies

    def start_swap(
        self, members: tuple[int, ...], ticket: int, out: PageCopies, into: PageCopies
    ) -> None:
        """Every member queues the copies of its shard of the pages (same ids on every
        member) on its copy thread; the replies come as soon as they are queued."""
        self.send_many(members, SwapStart(ticket, out, into))
        self._replies(members)

    def swap_progress(self, members: tuple[int, ...], wait_for: int | None = None) -> SwapProgress:
        self.send_many(members, SwapPoll(wait_for))
        return SwapProgress.of_group(self._replies(members))

    # -- reconfiguration ---------------------------------------------------------------------
    def migrate(
        self, pieces: list[Piece], mode: str = "pipelined", faults: FaultPlan | None = None
    ) -> list[TransferStats]:
        """Run a migration on every device involved; raise TransferFailed if any piece failed.

        All replies are drained even on failure, so the pool stays usable for a rollback.
        """
        devices = sorted({p.src for p in pieces} | {p.dst for p in pieces})
        self._migrations += 1  # names when sources' pages are ready (pool/shared_kv.py)
        self.send_many(devices, Migrate(pieces, mode, faults, self._migrations))
        return self._replies(tuple(devices))

    # -- KV to / from another host worker process (kv_wire.py) -----------------------------
    def kv_out(self, pieces: list[Piece]) -> list[torch.Tensor]:
        mine = {d: [p for p in pieces if p.src == d] for d in sorted({p.src for p in pieces})}
        for d, own in mine.items():
            self.send(d, KvOut(own))
        replies = self._replies(tuple(mine))  # NOTE: every device is drained, even on error
        blocks = {d: iter(r) for d, r in zip(mine, replies, strict=True)}
        return [next(blocks[p.src]) for p in pieces]

    def kv_in(self, pieces: list[Piece], blocks: list[torch.Tensor]) -> None:
        mine: dict[int, tuple[list[Piece], list[torch.Tensor]]] = {}
        for p, b in zip(pieces, blocks, strict=True):
            entry = mine.setdefault(p.dst, ([], []))
            entry[0].append(p)
            entry[1].append(b)
        for d, (own, own_blocks) in mine.items():
            self.send(d, KvIn(own, own_blocks))
        self._replies(tuple(mine))

    # -- KV between hosts over NIXL (nixl_endpoint.py) ---------------------------------------
    def nixl_open(self) -> list[tuple[bytes, KVRegion]]:
        every = tuple(range(self.num_devices))
        self.send_many(every, NixlOpen())
        return self._replies(every)

    def nixl_connect(self, metadata: list[bytes]) -> None:
        every = tuple(range(self.num_devices))
        self.send_many(every, NixlConnect(metadata))
        self._replies(every)

    def nixl_read(self, reads: dict[int, list[Read]], timeout_s: float) -> int:
        devices = tuple(sorted(reads))
        for d in devices:
            self.send(d, NixlRead(reads[d], timeout_s))
        return sum(self._replies(devices))

    def close(self) -> None:
        self._steps.clear()
        self._due.clear()
        for proc, _ in self.starting.values():
            proc.kill()  # NOTE: still loading; nothing of it is in use
        for conn, proc in zip(self.conns, self.procs, strict=True):
            if proc.is_alive():
                with contextlib.suppress(BrokenPipeError, OSError):
                    conn.send_bytes(pickle.dumps(Stop()))
        for proc in [*self.procs, *(p for p, _ in self.starting.values())]:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()

    def __enter__(self) -> DevicePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
