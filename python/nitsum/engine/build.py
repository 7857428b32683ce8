"""Assemble a single-device engine from a config and HF-named tensors."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from nitsum.config import DEFAULT_TP_LEVELS, ModelConfig, mlp_blocks
from nitsum.engine.engine import Engine
from nitsum.engine.runner import ModelRunner
from nitsum.engine.scheduler import Scheduler
from nitsum.engine.swap import SwapSpace
from nitsum.kv.host_pool import HostKVPool, host_pages_in
from nitsum.kv.pages import PageAllocator
from nitsum.kv.pool import KVPool
from nitsum.models.llama import LlamaModel
from nitsum.parallel.context import build_context
from nitsum.parallel.shift import ShiftRule
from nitsum.weights.layout import build_weights


@dataclass
class EngineConfig:
    """Engine knobs with sane CPU defaults."""

    dtype: torch.dtype = torch.float32
    device: str = "cpu"
    kv_cache_bytes: int = 512 << 20
    page_tokens: int = 16
    max_batch: int = 64
    token_budget: int = 512
    max_context: int | None = None
    tp_levels: tuple[int, ...] = DEFAULT_TP_LEVELS
    # Short prompts overtake long ones that can spare the tokens (engine/prompt_order.py).
    overtaking: bool = True
    # Keep finished sequences' full KV pages for prompts that start the same way
    # (kv/prefix_cache.py).
    prefix_caching: bool = True
    # Host memory per device for the KV of swapped-out sequences (kv/host_pool.py); 0: none,
    # preemption always recomputes. (`nitsum serve` and the worker default to
    # config.HOST_KV_CACHE_MB.)
    host_kv_cache_bytes: int = 0
    # Swap-ins: "auto" (asynchronous unless a synchronous copy is cheaper, engine/swap.py),
    # "sync" or "async".
    swap_mode: str = "auto"
    # Under light load, run a request with a TTFT target on a TP group bound from idle
    # replicas (pool/binding.py, the load trigger); False: only bind_tp and long contexts bind.
    bind_idle: bool = False
    # When a group of ≥ 2 devices runs an iteration as SP instead of TP (parallel/shift.py).
    shift: ShiftRule = field(default_factory=ShiftRule)
    # Record decode steps per warm context and batch bucket at start-up (engine/graphs.py):
    # None = on CUDA only (CUDA graphs); True elsewhere runs the same static-buffer path
    # eagerly (tests).
    decode_graphs: bool | None = None

    @property
    def records_decode(self) -> bool:
        """Whether devices record decode steps (`decode_graphs`, resolved)."""
        if self.decode_graphs is None:
            return self.device.startswith("cuda")
        return self.decode_graphs


def build_model(
    cfg: ModelConfig, tensors: Iterable[tuple[str, torch.Tensor]], ecfg: EngineConfig
) -> LlamaModel:
    """Fuse the weights once, laid out for every TP level the model allows."""
    blocks = mlp_blocks(cfg, cfg.allowed_tp_levels(ecfg.tp_levels))
    return LlamaModel(cfg, build_weights(cfg, tensors, blocks, ecfg.dtype, ecfg.device))


def build_engine(
    cfg: ModelConfig,
    tensors: Iterable[tuple[str, torch.Tensor]],
    ecfg: EngineConfig | None = None,
    eos_token_ids: tuple[int, ...] | None = None,
) -> Engine:
    """A TP-1 engine on one device."""
    ecfg = ecfg or EngineConfig()
    model = build_model(cfg, tensors, ecfg)
    num_pages = KVPool.pages_in(cfg, ecfg.kv_cache_bytes, ecfg.page_tokens, ecfg.dtype)
    pool = KVPool(cfg, num_pages, ecfg.page_tokens, ecfg.dtype, ecfg.device)
    host_pages = host_pages_in(ecfg.host_kv_cache_bytes, pool.bytes_per_page)
    host = HostKVPool(pool, host_pages) if host_pages else None
    runner = ModelRunner(model, pool, build_context(cfg, model.weights, 1, 0), host)
    pages = PageAllocator(1, num_pages, ecfg.page_tokens, cfg.num_kv_heads).group((0,), 1)
    swap = None
    if host_pages:
        host_view = PageAllocator(1, host_pages, ecfg.page_tokens, cfg.num_kv_heads).group((0,), 1)
        swap = SwapSpace(host_view, pages, pool.bytes_per_page, ecfg.swap_mode)
    scheduler = Scheduler(
        pages, ecfg.max_batch, ecfg.token_budget, ecfg.overtaking, ecfg.prefix_caching, swap
    )
    return Engine(cfg, runner, scheduler, ecfg.max_context, eos_token_ids)
