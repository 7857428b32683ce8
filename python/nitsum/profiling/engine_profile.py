"""A TP-1 profile of Nitsum's own engine on one accelerator (`nitsum profile --device cuda`).

One in-process device (pool/local.py), as a one-GPU worker runs it: the fused weights, the
paged KV pool, and on CUDA the decode steps recorded as CUDA graphs at start-up (a decode
point within the largest recorded batch bucket replays its graph, a larger one runs eagerly,
exactly as serving does). Each point times `launch_step` + `collect_step` of a hand-built
batch (profiling/measure.py), synchronized with the device: prefill latency vs prompt tokens
and decode step latency vs (batch, context). Decode points whose KV does not fit the pool are
left out.

TP > 1 on GPUs is not measured here: a planner that needs those levels scales this TP-1
profile with the analytic collective cost (profiling/analytic.py: two ring all-reduces per
layer of `tokens x hidden x 2` bytes, `2(t-1)/t x bytes / NVLink + alpha` each) after
dividing the compute/memory part by `t` (docs/gpu.md, "Profiles").
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from nitsum.config import ModelConfig
from nitsum.engine.engine_config import EngineConfig
from nitsum.pool.local import local_engine
from nitsum.profiling.measure import measure_profile

# The analytic profile's grid (profiling/analytic.py), so measured and analytic files line up.
GPU_PREFILL_TOKENS = (64, 128, 256, 512, 1024, 2048, 4096, 8192)
GPU_DECODE_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
GPU_DECODE_CONTEXTS = (256, 1024, 2048, 4096, 8192)
QUICK_GRID = {"prefill_tokens": (128, 1024), "batches": (1, 16, 64), "contexts": (1024,)}


def profile_engine_config(
    device: str, dtype: torch.dtype, kv_cache_bytes: int, longest: int
) -> EngineConfig:
    """The engine of a one-device worker, its window (and so its recorded page tables) long
    enough for the longest point."""
    return EngineConfig(
        device=device,
        dtype=dtype,
        kv_cache_bytes=kv_cache_bytes,
        max_context=longest,
        warm_kernels=device.startswith("cuda"),  # as the worker's
    )


def measure_engine_profile(
    cfg: ModelConfig,
    tensors: Iterable[tuple[str, torch.Tensor]],
    model_name: str,
    device_kind: str,
    ecfg: EngineConfig,
    repeats: int = 5,
    prefill_tokens: tuple[int, ...] = GPU_PREFILL_TOKENS,
    batches: tuple[int, ...] = GPU_DECODE_BATCHES,
    contexts: tuple[int, ...] = GPU_DECODE_CONTEXTS,
) -> dict:
    """A `nitsum-profile/1` dict with TP level 1 only, measured on `ecfg.device`."""
    pe = local_engine(cfg, tensors, ecfg)
    try:
        profile = measure_profile(
            pe, cfg, model_name, device_kind, repeats, prefill_tokens, batches, contexts
        )
    finally:
        pe.pool.close()
    profile["host"]["device"] = ecfg.device
    if ecfg.device.startswith("cuda"):
        profile["host"]["gpu"] = torch.cuda.get_device_name(torch.device(ecfg.device))
    profile["decode_graphs"] = ecfg.records_decode
    return profile
