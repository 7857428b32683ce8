"""Joining the KV transport between host worker processes: NIXL, or gloo where it cannot.

Every process of the transport meets at the rendezvous store (`--kv-peers tcp://H:P`, rank 0
hosts it) and publishes what it serves and, unless it was told `--kv-backend gloo`, its NIXL
agents: the host worker's (control messages) and each device's (its KV pages registered),
with their metadata and the devices' KV regions. Then every process makes the same choice
from what all published (`choose_backend`): NIXL when every process has it, else gloo, with
a warning naming the process that has not and why (`--kv-backend nixl` refuses to start
then). Over NIXL each process loads every other's agent metadata before it serves.
"""

from __future__ import annotations

import base64
import json
import logging
from typing import Any

from nitsum.pool.device_pool import DeviceError
from nitsum.pool.devices import Devices
from nitsum.pool.nixl_agent import Agent, NixlUnavailable
from nitsum.pool.nixl_descs import KVRegion
from nitsum.pool.nixl_peers import NixlPeers
from nitsum.pool.peers import KVPeers, rendezvous

log = logging.getLogger(__name__)

BACKENDS = ("auto", "nixl", "gloo")


def choose_backend(records: list[dict[str, Any]]) -> tuple[str, str]:
    """("nixl" | "gloo", why not NIXL: "" when chosen or asked for) from every rank's record
    (`backend` asked for, `host` when its NIXL agents started, else `why`).
    ValueError when a rank asked for NIXL and another cannot have it."""
    asked = [r["backend"] for r in records]
    if "gloo" in asked:
        why = "" if set(asked) == {"gloo"} else f"rank {asked.index('gloo')} asked for gloo"
        choice, reason = "gloo", why
    else:
        missing = [(i, r.get("why", "?")) for i, r in enumerate(records) if "host" not in r]
        if not missing:
            return "nixl", ""
        choice = "gloo"
        reason = "; ".join(f"NIXL unavailable on rank {i}: {why}" for i, why in missing)
    if "nixl" in asked:
        raise ValueError(f"--kv-backend nixl (rank {asked.index('nixl')}): {reason}")
    return choice, reason


def nixl_record(pool: Devices, device_ids: list[int]) -> tuple[Agent, dict[str, Any]]:
    """This process's host agent and its record's NIXL part (its devices' agents opened)."""
    host = Agent("host")
    try:
        opened = pool.nixl_open()
    except BaseException:
        host.close()
        raise
    devices = [
        {"id": w, "md": base64.b64encode(md).decode(), "region": region.to_wire()}
        for w, (md, region) in zip(device_ids, opened, strict=True)
    ]
    return host, {
        "host": host.name,
        "md": base64.b64encode(host.metadata()).decode(),
        "devices": devices,
    }


def open_kv_transport(
    addr: str,
    rank: int,
    world: int,
    pool: Devices,
    device_ids: list[int],
    backend: str = "auto",
    timeout_s: float = 5.0,
    rendezvous_s: float = 300.0,
    stall_s: float = 0.0,
    stall_file: str | None = None,
) -> KVPeers | NixlPeers:
    """Join the transport at `addr` as `rank` of `world` (see the module docstring).
    ValueError / RuntimeError when it cannot be joined (a bad address, no rendezvous in time,
    NIXL asked for and missing). `stall_s` (gloo) and `stall_file` (NIXL): tests only."""
    if backend not in BACKENDS:
        raise ValueError(f"--kv-backend must be one of {BACKENDS}, got {backend!r}")
    store = rendezvous(addr, rank, world, rendezvous_s)
    record: dict[str, Any] = {"ids": device_ids, "backend": backend}
    host: Agent | None = None
    if backend != "gloo":
        try:
            host, nixl = nixl_record(pool, device_ids)
            record |= nixl
        except (NixlUnavailable, DeviceError) as e:
            record["why"] = str(e).strip().splitlines()[-1][:300]
    store.set(f"hello/{rank}", json.dumps(record))
    records = [json.loads(store.get(f"hello/{r}")) for r in range(world)]
    choice, why = choose_backend(records)
    if choice == "gloo":
        if host is not None:
            host.close()
        if why:
            log.warning("KV transport over gloo, not NIXL: %s", why)
        return KVPeers(store, rank, world, device_ids, timeout_s, stall_s, rendezvous_s)
    assert host is not None
    peers = join_nixl(records, rank, host, pool, device_ids, timeout_s, stall_file)
    peers.store = store  # NOTE: rank 0's hosts the rendezvous: others may still be reading it
    return peers


def join_nixl(
    records: list[dict[str, Any]],
    rank: int,
    host: Agent,
    pool: Devices,
    device_ids: list[int],
    timeout_s: float = 5.0,
    stall_file: str | None = None,
) -> NixlPeers:
    """This process's end of the NIXL transport, from every rank's record: each agent loads
    the metadata of the other processes' agents."""
    others = [r for i, r in enumerate(records) if i != rank]
    host.connect([base64.b64decode(r["md"]) for r in others])
    pool.nixl_connect([base64.b64decode(d["md"]) for r in others for d in r["devices"]])
    regions = {d["id"]: KVRegion.from_wire(d["region"]) for r in records for d in r["devices"]}
    owner = {w: i for i, r in enumerate(records) for w in r["ids"]}
    hosts = {i: r["host"] for i, r in enumerate(records)}
    first_id = min(device_ids)
    return NixlPeers(rank, host, hosts, owner, regions, pool, first_id, timeout_s, stall_file)
