"""The KV transport between host worker processes over gloo: torch.distributed point to point.

NOTE: the fallback where NIXL cannot load (kv_rendezvous.py; nixl_peers.py is the transport).

Every host worker process of a deployment joins one gloo process group (`KVPeers`), formed at
start-up on a rendezvous address (a `TCPStore`; `nitsum worker --kv-peers tcp://H:P --kv-rank
r --kv-world n`, docs/serving.md). Each process publishes the worker ids it serves, so a
sender finds the rank that owns a decode target. A handoff is three messages on one tag:
a header (sequence number, metadata bytes, payload bytes), the metadata (msgpack) and the KV
(kv_wire.py's wire tensor, as raw bytes).

One receiver thread per peer blocks on that peer's next header, then takes the other two
messages with a timeout: a peer that dies mid-transfer costs the receiver at most one timeout,
never a hang, and the partial handoff is dropped (the router re-runs the request, see
docs/protocol.md). A peer whose connection broke (it died, or a transfer timed out: gloo
closes the pair then) is lost for good: handoffs to it are refused at once and its process
must rejoin a new group (restart every process of the transport).
NOTE: gloo cannot cancel a blocked receive, and a process exiting with one blocked aborts in
the C++ runtime; a process with a `KVPeers` therefore ends with `os._exit` after its cleanup
(worker/__main__.py). The KV leaves and enters the devices through host memory here
(pack to CPU, gloo, unpack); a CUDA deployment would send device to device over NCCL, which
this module does not do yet.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from datetime import timedelta
from typing import Any
from urllib.parse import urlparse

import msgpack
import numpy as np
import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

TAG = 7  # every handoff message travels on this tag
# NOTE: an idle peer's next header may be days away; gloo applies the group's timeout to a
# wait without one, so the header wait names this one explicitly.
IDLE_WAIT = timedelta(days=365)
STORE_PREFIX = "nitsum-kv"


class PeerError(RuntimeError):
    """A handoff could not be sent (the peer is gone or too slow); nothing was committed."""


def parse_addr(addr: str) -> tuple[str, int]:
    """`tcp://host:port` → (host, port); ValueError naming the address otherwise."""
    url = urlparse(addr)
    if url.scheme != "tcp" or not url.hostname or not url.port:
        raise ValueError(f"--kv-peers: expected tcp://HOST:PORT, got {addr!r}")
    return url.hostname, url.port


def rendezvous(addr: str, rank: int, world: int, wait_s: float) -> dist.Store:
    """The transport's store at `addr` (rank 0 hosts it), once every rank joined or `wait_s`
    passed (RuntimeError)."""
    host, port = parse_addr(addr)
    wait = timedelta(seconds=wait_s)
    store = dist.TCPStore(host, port, world, is_master=rank == 0, timeout=wait)
    return dist.PrefixStore(STORE_PREFIX, store)


class KVPeers:
    """This process's end of the KV transport: send handoffs to the process owning a worker
    id, and collect the ones that arrive (`arrivals`)."""

    kind = "gloo"

    def __init__(
        self,
        addr: str | dist.Store,
        rank: int,
        world: int,
        device_ids: list[int],
        timeout_s: float = 5.0,
        stall_s: float = 0.0,
        rendezvous_s: float = 300.0,
    ) -> None:
        """Join the group at `addr` (or on a store already joined there: `rendezvous`) as
        `rank` of `world` (rank 0 hosts the store) serving `device_ids`. `timeout_s` bounds
        every message of a transfer (keep it under the router's heartbeat timeout: a send
        blocks this process's loop), `rendezvous_s` the wait for every process at start-up;
        `stall_s` (tests only) sleeps between a handoff's metadata and its KV, so a test can
        kill the sender mid-transfer."""
        if not 0 <= rank < world:
            raise ValueError(f"--kv-rank must be in [0, {world}), got {rank}")
        self.rank, self.world = rank, world
        self.timeout = timedelta(seconds=timeout_s)
        self.stall_s = stall_s
        wait = timedelta(seconds=rendezvous_s)
        self.store = rendezvous(addr, rank, world, rendezvous_s) if isinstance(addr, str) else addr
        self.store.set(f"ids/{rank}", json.dumps(device_ids))
        # Worker id -> the rank of the process that serves it.
        self.owner: dict[int, int] = {}
        for r in range(world):
            for d in json.loads(self.store.get(f"ids/{r}")):
                self.owner[int(d)] = r
        self.pg = dist.ProcessGroupGloo(self.store, rank, world, wait)
        self._sent = 0
        self._inbox: queue.Queue[tuple[dict[str, Any], torch.Tensor]] = queue.Queue()
        self.lost: set[int] = set()  # ranks whose connection broke
        self.failures = 0  # transfers dropped on the receiving side (peer died or timed out)
        for src in range(world):
            if src != rank:
                name = f"kv-peers-{src}"
                threading.Thread(target=self._receive, args=(src,), name=name, daemon=True).start()
        log.info("KV transport: rank %d of %d, peers serve %s", rank, world, sorted(self.owner))

    def serves(self, worker_id: int) -> bool:
        """Whether another process of the group, still connected, serves `worker_id`."""
        owner = self.owner.get(worker_id, self.rank)
        return owner != self.rank and owner not in self.lost

    # -- sending ----------------------------------------------------------------------------
    def send(self, worker_id: int, meta: dict[str, Any], kv: torch.Tensor) -> int:
        """Send one handoff to the process serving `worker_id`; returns the KV bytes sent.

        Raises PeerError when a message is not taken within the timeout or the peer is gone.
        """
        dst = self.owner[worker_id]
        if dst in self.lost:
            raise PeerError(f"KV transport: rank {dst} (worker {worker_id}) is lost")
        raw = _raw_bytes(kv)
        meta = {
            **meta,
            "kv_dtype": str(kv.dtype).removeprefix("torch."),
            "kv_shape": list(kv.shape),
        }
        body = torch.from_numpy(np.frombuffer(msgpack.packb(meta), dtype=np.uint8).copy())
        self._sent += 1
        header = torch.tensor([self._sent, body.numel(), raw.numel()], dtype=torch.int64)
        try:
            self._send(header, dst)
            self._send(body, dst)
            if self.stall_s:
                time.sleep(self.stall_s)
            self._send(raw, dst)
        except RuntimeError as e:  # gloo: connection closed / timed out; the pair is broken
            self.lost.add(dst)
            raise PeerError(f"KV handoff to worker {worker_id} (rank {dst}) failed: {e}") from e
        return raw.numel()

    def _send(self, t: torch.Tensor, dst: int) -> None:
        self.pg.send([t], dst, TAG).wait(self.timeout)  # type: ignore[attr-defined]

    # -- receiving --------------------------------------------------------------------------
    def pending(self) -> bool:
        """Whether handoffs arrived that `arrivals` has not returned yet."""
        return not self._inbox.empty()

    def arrivals(self) -> list[tuple[dict[str, Any], torch.Tensor]]:
        """The complete handoffs received since the last call: (metadata, KV tensor)."""
        out = []
        while True:
            try:
                out.append(self._inbox.get_nowait())
            except queue.Empty:
                return out

    def _receive(self, src: int) -> None:
        """Thread: take the handoffs of peer `src` one at a time until its connection breaks."""
        while True:
            header = torch.zeros(3, dtype=torch.int64)
            try:
                self.pg.recv([header], src, TAG).wait(IDLE_WAIT)  # type: ignore[attr-defined]
            except RuntimeError as e:
                self.lost.add(src)
                log.warning("KV transport: rank %d lost: %s", src, e)
                return
            _, meta_len, kv_len = header.tolist()
            try:
                body = self._recv(torch.empty(meta_len, dtype=torch.uint8), src)
                raw = self._recv(torch.empty(kv_len, dtype=torch.uint8), src)
            except RuntimeError as e:
                # NOTE: the sender died or stalled past the timeout mid-transfer; nothing of
                # this handoff was adopted, so dropping it loses nothing the router cannot redo.
                self.failures += 1
                self.lost.add(src)
                log.warning("KV transport: handoff from rank %d dropped, rank lost: %s", src, e)
                return
            meta = msgpack.unpackb(body.numpy().tobytes(), raw=False)
            dtype = getattr(torch, meta["kv_dtype"])
            self._inbox.put((meta, raw.view(dtype).view(meta["kv_shape"])))

    def _recv(self, t: torch.Tensor, src: int) -> torch.Tensor:
        self.pg.recv([t], src, TAG).wait(self.timeout)  # type: ignore[attr-defined]
        return t


def _raw_bytes(t: torch.Tensor) -> torch.Tensor:
    """`t`'s bytes as a flat uint8 tensor (bfloat16 included: numpy has no such type)."""
    return t.contiguous().view(-1).view(torch.uint8)
