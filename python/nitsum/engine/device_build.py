"""The one way a device is assembled: weights, KV pool, host KV tier, and a runner per context.

A single-device engine (engine/build.py), the in-process device of a one-device pool
(pool/local.py) and each device process of a pool (pool/device_proc.py) all build their
device here, so a knob of `EngineConfig` (the KV scratch page, decode graphs, the host tier)
means the same on all three.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from nitsum.config import ModelConfig, mlp_blocks
from nitsum.engine.engine_config import EngineConfig
from nitsum.engine.graphs import (
    DecodeGraphs,
    decode_buckets,
    decode_context,
    graph_memory_pool,
)
from nitsum.engine.piecewise import PiecewiseGraphs, token_buckets
from nitsum.engine.runner import ModelRunner
from nitsum.kv.cache import KVCache
from nitsum.kv.host_tier import HostKVTier, host_pages_in
from nitsum.models.llama import LlamaModel
from nitsum.parallel.context import TPContext
from nitsum.parallel.shared_memory import SharedBuffer
from nitsum.weights.layout import build_weights


def build_model(
    cfg: ModelConfig, tensors: Iterable[tuple[str, torch.Tensor]], ecfg: EngineConfig
) -> LlamaModel:
    """Fuse the weights once, laid out for every TP level the model allows."""
    blocks = mlp_blocks(cfg, cfg.allowed_tp_levels(ecfg.tp_levels))
    weights = build_weights(cfg, tensors, blocks, ecfg.dtype, ecfg.device)
    return LlamaModel(cfg, weights, ecfg.fused_ops)


def pages_for_config(cfg: ModelConfig, ecfg: EngineConfig) -> int:
    """KV pages of one device that `ecfg.kv_cache_bytes` buys."""
    return KVCache.pages_in(cfg, ecfg.kv_cache_bytes, ecfg.page_tokens, ecfg.dtype)


class DeviceBuild:
    """One device's model, KV pool and host KV tier; `runner(ctx)` gives a runner under a
    parallel context over them.

    NOTE: every runner of a device shares its model and KV pool (a TP switch only names
    another context), and every recorded step (decode or piecewise) shares one graph memory
    pool.
    """

    def __init__(
        self,
        cfg: ModelConfig,
        tensors: Iterable[tuple[str, torch.Tensor]],
        ecfg: EngineConfig,
        num_pages: int,
        shared_kv: bool = False,
    ) -> None:
        """`shared_kv`: lay the KV pages in memory the host's other device processes can map
        (`kv_memory`; pool/shared_kv.py), so a KV move reads them in place."""
        self.cfg = cfg
        self.ecfg = ecfg
        if ecfg.seed is not None:
            # NOTE: seeds this process's CPU and CUDA generators, the ones unseeded
            # requests draw from (sampling.sample_on_device); one device per process.
            torch.manual_seed(ecfg.seed)
        self.model = build_model(cfg, tensors, ecfg)
        # A recorded step writes its padding rows' K/V to a scratch page past the allocator's
        # (engine/graphs.py, engine/piecewise.py).
        scratch = ecfg.records_steps
        self.kv_memory: SharedBuffer | None = None
        if shared_kv:
            nbytes = KVCache.storage_bytes(cfg, num_pages, ecfg.page_tokens, ecfg.dtype, scratch)
            self.kv_memory = SharedBuffer(nbytes, ecfg.device)
        memory = self.kv_memory.tensor if self.kv_memory is not None else None
        self.kv = KVCache(
            cfg, num_pages, ecfg.page_tokens, ecfg.dtype, ecfg.device, scratch, memory
        )
        host_pages = host_pages_in(ecfg.host_kv_cache_bytes, self.kv.bytes_per_page)
        self.host: HostKVTier | None = HostKVTier(self.kv, host_pages) if host_pages else None
        self._memory_pool = graph_memory_pool(ecfg.device) if ecfg.records_steps else None

    def runner(self, ctx: TPContext, swaps: bool = False, graphs: bool = True) -> ModelRunner:
        """A runner under `ctx`: with `swaps`, it runs the host tier's copies itself (one
        runner per device does); with `graphs`, its decode steps are recorded when the config
        records them (a pipeline stage's are not): decode steps per batch bucket, and the
        other steps piecewise per token bucket."""
        ecfg, recorded, piecewise = self.ecfg, None, None
        if graphs and ecfg.records_decode:
            window = decode_context(self.cfg, ecfg.max_context)
            buckets = decode_buckets(ecfg.max_batch)
            recorded = DecodeGraphs(self.model, ctx, self.kv, window, buckets, self._memory_pool)
        if graphs and ecfg.records_piecewise:
            buckets = token_buckets(ecfg.token_budget)
            piecewise = PiecewiseGraphs(self.model, ctx, self.kv, buckets, self._memory_pool)
        warm = ecfg.warm_kernels and ecfg.device.startswith("cuda")
        if graphs and warm and self.kv.scratch_page is not None:
            # NOTE: CUDA attends with the Triton kernels (models/llama.py): compile their
            # variants here, not in a serving step. Lazy: Triton is only needed where used.
            from nitsum.engine.attention_warmup import warm_attention

            warm_attention(self.model, ctx, self.kv, ecfg.max_batch)
        host = self.host if swaps else None
        return ModelRunner(self.model, self.kv, ctx, host, recorded, piecewise)
