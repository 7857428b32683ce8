"""Run a function in N processes of one gloo world (what the shared-collectives tests need
below a device pool): each returns a picklable value, or its traceback."""

from __future__ import annotations

import multiprocessing as mp
import queue
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from nitsum.ports import free_port


def _main(rank: int, world: int, addr: str, fn: Callable[..., Any], args: tuple, out: Any) -> None:
    try:
        dist.init_process_group("gloo", init_method=addr, rank=rank, world_size=world)
        out.put((rank, "ok", fn(rank, world, *args)))
    except BaseException:  # noqa: BLE001 - the test reports it
        out.put((rank, "error", traceback.format_exc()))


def run_group(
    world: int, fn: Callable[..., Any], *args: Any, timeout: float = 120.0
) -> dict[int, tuple[str, Any]]:
    """{rank: (status, value)} of `fn(rank, world, *args)` in `world` spawned processes;
    a process that exits without reporting is absent."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    addr = f"tcp://127.0.0.1:{free_port()}"
    procs = [ctx.Process(target=_main, args=(r, world, addr, fn, args, out)) for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, tuple[str, Any]] = {}
    deadline = time.monotonic() + timeout
    # NOTE: until every rank reported, or every process is gone and nothing is left to read.
    while len(results) < world and time.monotonic() < deadline:
        try:
            rank, status, value = out.get(timeout=0.2)
            results[rank] = (status, value)
        except queue.Empty:
            if not any(p.is_alive() for p in procs) and out.empty():
                break
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
    return results
