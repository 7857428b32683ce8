"""The KV pool each worker gets from `nitsum serve` (`--kv-cache-mb`,
`--gpu-memory-utilization`): as given, else a share of the GPU's memory on CUDA (vLLM's
default), a fixed size on CPU."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

log = logging.getLogger("nitsum.serve")  # NOTE: `nitsum serve`'s own log

# KV pool per device without --kv-cache-mb: on CPU a fixed size, on CUDA this share of the
# device's memory (weights, KV and the reserve together; vLLM's default too).
CPU_KV_CACHE_MB = 512
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9

# NOTE: what a CUDA device needs beside weights and KV (activations, CUDA graphs, allocator
# slack); vLLM profiles it, we reserve a fixed amount.
CUDA_RESERVE_BYTES = 2 << 30


def kv_cache_mb_for(
    total: int, used: int, weights: int, utilization: float, devices: int = 1
) -> int:
    """KV MiB per device so that `devices` device processes sharing the GPU, each with its
    weights, KV and the reserve, use `utilization` of `total` bytes, with `used` bytes already
    taken by others; ValueError when nothing is left."""
    room = int(total * utilization) - used - devices * (weights + CUDA_RESERVE_BYTES)
    if room < devices << 20:
        raise ValueError(
            f"--gpu-memory-utilization {utilization}: no room for KV ({total >> 20} MiB "
            f"device, {used >> 20} MiB in use, {devices} x (weights {weights >> 20} MiB + "
            f"reserve {CUDA_RESERVE_BYTES >> 20} MiB))"
        )
    return room // devices >> 20


def kv_sizing(args: argparse.Namespace, model_dir: Path) -> None:
    """Set `args.kv_cache_mb`: as given; else with `--gpu-memory-utilization` (on CUDA
    `DEFAULT_GPU_MEMORY_UTILIZATION` when neither is given) from GPU 0's memory (every
    device holds a whole copy of the weights at TP 1, the largest share; with
    `--devices-per-gpu K` the GPU's K devices split what is left); else on CPU
    `CPU_KV_CACHE_MB`.

    NOTE: a fixed small default on a GPU starves the engine: 512 MiB holds 4k tokens of an
    8B model, and a full pool evicts cached prefixes and then preempts (the 2026-11-27 H200
    run's 30 GB pool was full for the last third of the bursty load).
    """
    defaulted = False
    if args.gpu_memory_utilization is None and args.kv_cache_mb is None:
        if args.device == "cuda":
            args.gpu_memory_utilization = DEFAULT_GPU_MEMORY_UTILIZATION
            defaulted = True
        else:
            args.kv_cache_mb = CPU_KV_CACHE_MB
    if args.gpu_memory_utilization is None:
        return
    import torch

    free, total = torch.cuda.mem_get_info(0)
    weights = sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))
    try:
        args.kv_cache_mb = kv_cache_mb_for(
            total, total - free, weights, args.gpu_memory_utilization, args.devices_per_gpu
        )
    except ValueError as e:
        if not defaulted:
            raise
        raise ValueError(
            f"{e}; that is the CUDA default: give --kv-cache-mb, or a higher "
            "--gpu-memory-utilization if the memory in use is yours"
        ) from None
    log.info("--gpu-memory-utilization: %d MiB of KV per device", args.kv_cache_mb)
