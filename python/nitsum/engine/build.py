"""A single-device TP-1 `Engine` without a pool: for tests and tools that drive the engine
and its scheduler directly (serving goes through a PoolEngine, pool/local.py)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from nitsum.config import ModelConfig
from nitsum.engine.device_build import DeviceBuild, pages_for_config
from nitsum.engine.engine import Engine
from nitsum.engine.engine_config import EngineConfig
from nitsum.engine.overlap import enable_overlap, overlap_wanted
from nitsum.engine.scheduler import Scheduler
from nitsum.engine.swap import SwapSpace
from nitsum.kv.pages import PageAllocator
from nitsum.parallel.context import build_context


def build_engine(
    cfg: ModelConfig,
    tensors: Iterable[tuple[str, torch.Tensor]],
    ecfg: EngineConfig | None = None,
    eos_token_ids: tuple[int, ...] | None = None,
) -> Engine:
    """A TP-1 engine on one device (the device built as every device is: DeviceBuild)."""
    ecfg = ecfg or EngineConfig()
    num_pages = pages_for_config(cfg, ecfg)
    device = DeviceBuild(cfg, tensors, ecfg, num_pages)
    runner = device.runner(build_context(cfg, device.model.weights, 1, 0), swaps=True)
    heads = cfg.num_kv_heads
    pages = PageAllocator(1, num_pages, ecfg.page_tokens, heads).group((0,), 1)
    swap = None
    if device.host is not None:
        host_pages = device.host.num_pages
        host_view = PageAllocator(1, host_pages, ecfg.page_tokens, heads).group((0,), 1)
        swap = SwapSpace(host_view, pages, device.kv.bytes_per_page, ecfg.swap_mode)
    scheduler = Scheduler(
        pages, ecfg.max_batch, ecfg.token_budget, ecfg.overtaking, ecfg.prefix_caching, swap
    )
    engine = Engine(cfg, runner, scheduler, ecfg.max_context, eos_token_ids)
    if overlap_wanted(ecfg.device, ecfg.overlap):
        enable_overlap(engine, runner)
    return engine
