"""One NIXL agent (UCX backend) of this process: the KV transport between hosts.

NIXL (NVIDIA Inference Xfer Library; vLLM's NixlConnector, SGLang and Dynamo move
disaggregated KV with it) moves registered memory between agents by descriptor lists, with
READ or WRITE and small notifications. Its UCX backend picks the transport: cross-memory
attach or shared memory between processes of one machine, TCP between hosts without RDMA,
RDMA / NVLink / cuda_ipc where the cluster has them.

Every device of a host worker registers its KV pages with an agent of its own
(`nixl_endpoint.py`); the host worker process has one more, for the control messages of a
handoff (offer, taken, refused: `nixl_peers.py`). An agent is named after its host, process
id and a serial, unique within a deployment.

NOTE: NIXL's own progress thread polls without pause (a whole core per agent); this module
drives progress from a thread that polls every `POLL_S` instead, and keeps the notifications
that it collects for `notifs()`. The side a READ targets must progress for it over TCP.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import queue
import socket
import threading
import time
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

POLL_S = 0.001
_SERIAL = itertools.count()  # agents of one process differ by it
# The wheels of the NIXL Python API, for CUDA 13 and 12 (both run on CPU-only machines).
MODULES = ("nixl_cu13._api", "nixl_cu12._api", "nixl._api")


class NixlUnavailable(RuntimeError):
    """NIXL cannot be used in this process (the message names why)."""


def load_nixl() -> ModuleType:
    """NIXL's Python API module; NixlUnavailable naming why not."""
    import importlib

    errors = []
    for name in MODULES:
        try:
            return importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - ImportError, or a native library that fails
            errors.append(f"{name}: {type(e).__name__}: {e}")
    raise NixlUnavailable("cannot import NIXL (" + "; ".join(errors) + ")")


@dataclass(frozen=True)
class Read:
    """One READ from one remote agent: rows (address, bytes, device id) of the local
    destination and of the remote source, pairwise of equal length."""

    agent: str
    local: np.ndarray
    remote: np.ndarray
    local_mem: str = "DRAM"  # NIXL memory types: DRAM or VRAM
    remote_mem: str = "DRAM"


class Agent:
    """A NIXL agent with the UCX backend, progressed by a thread of its own."""

    def __init__(self, role: str) -> None:
        """NixlUnavailable when NIXL does not load or its UCX backend does not start."""
        api = load_nixl()
        self.name = f"nitsum-{role}-{socket.gethostname()}-{os.getpid()}-{next(_SERIAL)}"
        try:
            config = api.nixl_agent_config(
                enable_prog_thread=False,
                backends=["UCX"],
                sync_mode=api.nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT,
            )
            self.agent: Any = api.nixl_agent(self.name, config)
        except Exception as e:  # noqa: BLE001 - the native side raises its own types
            raise NixlUnavailable(f"NIXL agent did not start: {type(e).__name__}: {e}") from e
        if "UCX" not in self.agent.backends:
            raise NixlUnavailable("NIXL has no UCX backend plugin")
        self._notifs: queue.Queue[tuple[str, bytes]] = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._progress, name="nixl-progress", daemon=True)
        self._thread.start()
        # NOTE: the thread must stop before the interpreter tears NIXL down under it.
        atexit.register(self.close)

    def _progress(self) -> None:
        """Thread: progress the backend and collect notifications, every POLL_S."""
        while not self._stop.wait(POLL_S):
            try:
                for agent, msgs in self.agent.get_new_notifs().items():
                    for m in msgs:
                        self._notifs.put((agent, m))
            except Exception:  # noqa: BLE001 - a transient backend error must not stop it
                log.exception("NIXL progress failed")
                time.sleep(0.1)

    def metadata(self) -> bytes:
        """This agent's metadata (its connection info and registered memory) for peers."""
        return bytes(self.agent.get_agent_metadata())

    def connect(self, metadata: list[bytes]) -> list[str]:
        """Load the peers' metadata; returns their agent names."""
        names = []
        for md in metadata:
            name = self.agent.add_remote_agent(md)
            names.append(name.decode() if isinstance(name, bytes) else str(name))
        return names

    def register(self, tensor: Any) -> None:
        """Register a contiguous tensor's memory (peers may then read it)."""
        self.agent.register_memory(tensor)

    def send(self, agent: str, msg: bytes) -> None:
        """A notification to `agent` (RuntimeError if the backend refuses it)."""
        try:
            self.agent.send_notif(agent, msg)
        except Exception as e:  # noqa: BLE001
            raise RuntimeError(f"NIXL notification to {agent} failed: {e}") from e

    def has_notifs(self) -> bool:
        """Whether notifications wait for `notifs()`."""
        return not self._notifs.empty()

    def notifs(self, wait_s: float = 0.0) -> list[tuple[str, bytes]]:
        """(sender agent, message) of every notification collected since the last call;
        with `wait_s`, waits that long for the first when there is none."""
        out = []
        if wait_s > 0:
            try:
                out.append(self._notifs.get(timeout=wait_s))
            except queue.Empty:
                return out
        while True:
            try:
                out.append(self._notifs.get_nowait())
            except queue.Empty:
                return out

    def read(self, reads: list[Read], timeout_s: float) -> int:
        """Run every READ at once and wait for all; returns the bytes read.

        RuntimeError when one fails or is not done within `timeout_s`: every READ still in
        flight is then cancelled (released) before it returns, so nothing lands later.
        """
        handles = []
        try:
            for r in reads:
                local = self.agent.get_xfer_descs(r.local, r.local_mem)
                remote = self.agent.get_xfer_descs(r.remote, r.remote_mem)
                h = self.agent.initialize_xfer("READ", local, remote, r.agent)
                handles.append(h)
                if self.agent.transfer(h) == "ERR":
                    raise RuntimeError(f"NIXL READ from {r.agent} failed to start")
            deadline = time.monotonic() + timeout_s
            waiting = list(handles)
            while waiting:
                states = [self.agent.check_xfer_state(h) for h in waiting]
                if "ERR" in states:
                    raise RuntimeError("NIXL READ failed")
                waiting = [h for h, s in zip(waiting, states, strict=True) if s != "DONE"]
                if waiting and time.monotonic() > deadline:
                    raise RuntimeError(f"NIXL READ not done within {timeout_s:.1f} s")
                if waiting:
                    time.sleep(0.0002)
        except Exception as e:
            if not isinstance(e, RuntimeError):
                raise RuntimeError(f"NIXL READ failed: {type(e).__name__}: {e}") from e
            raise
        finally:
            for h in handles:
                try:
                    h.release()  # NOTE: cancels one still in flight
                except Exception:  # noqa: BLE001
                    log.error("NIXL could not cancel a READ: its destination may still change")
        return int(sum(int(r.local[:, 1].sum()) for r in reads))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1)
