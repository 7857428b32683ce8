"""Engine knobs: one `EngineConfig` for every engine and device a process builds."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from nitsum.config import BIND_POLICIES, DEFAULT_TP_LEVELS
from nitsum.parallel.communicators import resolve_collectives
from nitsum.parallel.shift import ShiftRule

# Per-step limits by device type: (token budget: prompt + decode tokens one step may run,
# running sequences cap). A GPU step costs about the same up to thousands of tokens (weight
# reads dominate), so it takes vLLM's 8192 tokens / 256 sequences; a CPU step grows with its
# tokens, so small steps keep decode latency low there.
STEP_LIMITS = {"cpu": (512, 64), "cuda": (8192, 256)}


def default_step_limits(device: str) -> tuple[int, int]:
    """(token_budget, max_batch) for `device` ("cuda:1" is a "cuda"; unknown types: CPU's)."""
    return STEP_LIMITS.get(device.split(":")[0], STEP_LIMITS["cpu"])


@dataclass
class EngineConfig:
    """Engine knobs with sane defaults; `max_batch` and `token_budget` left None take the
    device's (`default_step_limits`)."""

    dtype: torch.dtype = torch.float32
    device: str = "cpu"
    kv_cache_bytes: int = 512 << 20
    page_tokens: int = 16
    max_batch: int = None  # type: ignore[assignment]  # NOTE: an int after __post_init__
    token_budget: int = None  # type: ignore[assignment]
    max_context: int | None = None
    tp_levels: tuple[int, ...] = DEFAULT_TP_LEVELS
    # Short prompts overtake long ones that can spare the tokens (engine/prompt_order.py).
    overtaking: bool = True
    # Keep finished sequences' full KV pages for prompts that start the same way
    # (kv/prefix_cache.py).
    prefix_caching: bool = True
    # Host memory per device for the KV of swapped-out sequences (kv/host_tier.py); 0: none,
    # preemption always recomputes. (`nitsum serve` and the worker default to
    # config.HOST_KV_CACHE_MB.)
    host_kv_cache_bytes: int = 0
    # The floor of a pool step's deadline (pool/step_deadline.py: floor + 4x the expected
    # time); a device process that misses it is killed and lost like a crashed one.
    device_step_timeout_s: float = 5.0
    # Swap-ins: "auto" (asynchronous unless a synchronous copy is cheaper, engine/swap.py),
    # "sync" or "async".
    swap_mode: str = "auto"
    # Under light load, run a request with a TTFT target on a TP group bound from idle
    # replicas (pool/binding.py, the load trigger); False: only bind_tp and long contexts bind.
    bind_idle: bool = False
    # A `nitsum-profile/1` JSON of this model on these devices: the cost model of binding
    # (pool/bind_choice.py, scheduler-rs/src/binding/) weighs each chosen binding against
    # DP with it. None: no cost model (every trigger binds, as `bind_policy="always"`).
    binding_profile: str | None = None
    # "cost": a tier's `bind_tp` or `bind_idle` binds only when the cost model says it pays
    # (in full, for the prompt only, or not at all); "always": every trigger binds in full.
    # NOTE: a binding a context needs (no replica holds it) is never weighed: it is needed.
    bind_policy: str = "cost"
    # Scale the profile by the steps measured here (measured / profiled time per TP level,
    # pool/bind_choice.py): the profile was taken alone or elsewhere. False: as profiled.
    bind_calibrate: bool = True
    # When a group of ≥ 2 devices runs an iteration as SP instead of TP (parallel/shift.py).
    shift: ShiftRule = field(default_factory=ShiftRule)
    # Record decode steps per warm context and batch bucket at start-up (engine/graphs.py):
    # None = on CUDA only (CUDA graphs); True elsewhere runs the same static-buffer path
    # eagerly (tests).
    decode_graphs: bool | None = None
    # The fused Triton elementwise kernels and Triton attention (models/llama.py): None = on
    # CUDA only; True on CPU runs them under Triton's interpreter (tests).
    fused_ops: bool | None = None
    # Record every step but attention piecewise per token bucket at start-up
    # (engine/piecewise.py): None = on CUDA only; True elsewhere runs the same static-buffer
    # path eagerly (tests).
    piecewise_graphs: bool | None = None
    # A single-device engine prepares the next step while the device runs this one
    # (engine/overlap.py): None = on CUDA only (or as NITSUM_OVERLAP says); True forces it.
    overlap: bool | None = None
    # Compile the Triton attention kernels' variants when a CUDA device is built (with a KV
    # scratch page: when it records steps), not in the first step that needs each
    # (engine/attention_warmup.py): ~10 compiles at start-up. The worker (`nitsum serve`)
    # sets it on CUDA; off, each compiles on first use (tests, short offline runs).
    warm_kernels: bool = False
    # Device processes per GPU (a pool's device d runs on GPU d // devices_per_gpu): above 1
    # one GPU is a pool of several devices, whose collectives then go through shared buffers
    # (parallel/communicators.py). CPU devices ignore it.
    devices_per_gpu: int = 1
    # What carries a TP group's collectives: "auto" (shared buffers between CPU devices on
    # x86 and between processes that share a GPU; NCCL on a GPU of its own), "dist"
    # (torch.distributed: gloo or NCCL) or "shared" (parallel/shared_collectives.py).
    collectives: str = "auto"
    # Seed of each device's random draws (unseeded requests' sampling), set when the device
    # is built (engine/device_build.py): the same seed gives the same draws. None: unseeded.
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.bind_policy not in BIND_POLICIES:
            raise ValueError(f"bind_policy: one of {BIND_POLICIES}, not {self.bind_policy!r}")
        # NOTE: checked here, where every engine is configured, not first in a device process.
        resolve_collectives(self.collectives, self.device.split(":")[0], self.devices_per_gpu)
        budget, batch = default_step_limits(self.device)
        if self.token_budget is None:
            self.token_budget = budget
        if self.max_batch is None:
            self.max_batch = batch

    @property
    def records_decode(self) -> bool:
        """Whether devices record decode steps (`decode_graphs`, resolved)."""
        if self.decode_graphs is None:
            return self.device.startswith("cuda")
        return self.decode_graphs

    @property
    def records_piecewise(self) -> bool:
        """Whether devices record steps piecewise (`piecewise_graphs`, resolved)."""
        if self.piecewise_graphs is None:
            return self.device.startswith("cuda")
        return self.piecewise_graphs

    @property
    def records_steps(self) -> bool:
        """Whether devices record steps of either kind (their KV pool then has a scratch page
        for padding rows)."""
        return self.records_decode or self.records_piecewise
