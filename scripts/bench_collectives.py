"""A TP group's all-reduce on CPU device processes: shared memory (parallel/shared_collectives.py,
the default between CPU devices and the only way where processes share a GPU) against gloo's
process group, side by side in one run, for a decode step's, a prefill chunk's and a large
message, in groups of 2 and 4.

    python scripts/bench_collectives.py [--reps 200]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from group_procs import run_group  # noqa: E402
from nitsum.parallel.collectives import ProcessGroupCollectives  # noqa: E402
from nitsum.parallel.shared_collectives import SharedCollectives  # noqa: E402

# Floats: one decode row of a 576-wide model, 64 rows, a 512-token chunk of a 4096-wide one.
SIZES = {"decode row (2 KiB)": 576, "64 rows (144 KiB)": 64 * 576, "512 x 4096 (8 MiB)": 512 * 4096}


def _bench(rank: int, world: int, reps: int) -> dict[str, tuple[float, float]]:
    torch.set_num_threads(1)
    shared = SharedCollectives(tuple(range(world)), rank)
    handles: list[Any] = [None] * world
    dist.all_gather_object(handles, shared.handle())
    shared.attach(handles)
    gloo = ProcessGroupCollectives(dist.new_group(list(range(world))))
    out = {}
    for name, n in SIZES.items():
        us = []
        for comm in (gloo, shared):
            x = torch.randn(n)
            k = reps if n < 100_000 else max(5, reps // 10)
            for _ in range(3):
                comm.all_reduce(x)
            t0 = time.perf_counter()
            for _ in range(k):
                comm.all_reduce(x)
            us.append((time.perf_counter() - t0) / k * 1e6)
        out[name] = (us[0], us[1])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--reps", type=int, default=200)
    args = ap.parse_args()
    for world in (2, 4):
        results = run_group(world, _bench, args.reps)
        status, rows = results[0]
        if status != "ok":
            raise SystemExit(rows)
        for name, (gloo, shared) in rows.items():
            print(
                f"[all-reduce, {world} processes] {name:>20}: gloo {gloo:8.0f} us, shared "
                f"{shared:8.0f} us: {gloo / shared:.1f}x"
            )


if __name__ == "__main__":
    main()
