"""Engine knobs: one `EngineConfig` for every engine and device a process builds."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from nitsum.config import DEFAULT_TP_LEVELS
from nitsum.parallel.shift import ShiftRule


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
