"""Decode steps captured once per warm context and batch-size bucket (CUDA graphs).

A context's `DecodeGraphs` is built with the context, at start-up: for each bucket it runs a
decode step over static input buffers (token ids, positions, KV slots, page table, context
lengths) and records it. A step then copies its inputs into the buffers, pads the batch up to
the bucket and replays. A TP switch selects another context's graphs; nothing is captured
after start-up (`DecodeGraphs.freeze`, asserted like the communicator pool's groups).

Steps these recordings cannot run (a prefill chunk, a bigger batch, a longer context) run
piecewise (engine/piecewise.py), or eagerly.

Padding rows decode token 0 at position 0 with a context of one token, writing their K/V to
the pool's scratch page, which no sequence ever owns.

On CUDA a recording is a `torch.cuda.CUDAGraph` (attention then runs the Triton kernel,
whose loop bounds live on the device, so one graph serves every context length). Elsewhere it
is the same forward called eagerly over the static buffers: no speed-up, but the same buffer
and padding path, which is how CPU tests check it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from nitsum.config import ModelConfig
from nitsum.engine.step_inputs import StepInputs
from nitsum.kv.cache import KVCache
from nitsum.models.llama import LlamaModel
from nitsum.parallel import capture_cuts
from nitsum.parallel.context import TPContext
from nitsum_kernels.paged_attention import AttentionMetadata

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


def decode_buckets(max_batch: int) -> tuple[int, ...]:
    """DEFAULT_BUCKETS, doubled on up to the first bucket that holds `max_batch` sequences (a
    GPU's 256-sequence batches replay a recording too instead of running eagerly)."""
    buckets = list(DEFAULT_BUCKETS)
    while buckets[-1] < max_batch:
        buckets.append(buckets[-1] * 2)
    return tuple(buckets)


def decode_context(cfg: ModelConfig, max_context: int | None) -> int:
    """The longest context a recorded step's page table covers (the engine's window)."""
    return min(max_context or cfg.max_position_embeddings, cfg.max_position_embeddings)


def graph_memory_pool(device: str) -> object:
    """One CUDA graph memory pool a device's recordings share (one context runs at a time,
    so they may reuse each other's memory); None off CUDA."""
    return torch.cuda.graph_pool_handle() if device.startswith("cuda") else None


class CaptureAfterStartup(RuntimeError):
    """A decode graph was to be captured after start-up (on the switch or step path)."""


class Recording:
    """One recorded step: CUDA graphs, or the forward itself off CUDA.

    A collective that cannot be captured (parallel/capture_cuts.py: device processes sharing a
    GPU) cuts the recording: it is a list of (graph, call) segments, and a replay runs each
    graph, then its call (the collective, eagerly), in order. Without such collectives it is
    one graph.
    """

    def __init__(self, fn: Callable[[], torch.Tensor], device: torch.device, pool: Any) -> None:
        self.segments: list[tuple[torch.cuda.CUDAGraph, Callable[[], None] | None]] = []
        self.fn = fn
        if device.type == "cuda":
            # NOTE: under the weights' device: capture, Triton and NCCL use the current one.
            with torch.cuda.device(device):
                stream = torch.cuda.Stream(device)
                stream.wait_stream(torch.cuda.current_stream(device))
                with torch.cuda.stream(stream):
                    fn()  # warm-up: Triton compiles, allocators settle, collectives run
                torch.cuda.current_stream(device).wait_stream(stream)
                torch.cuda.synchronize(device)
                with torch.cuda.stream(stream):
                    self.out = self._capture(fn, pool)
        else:
            self.out = fn()

    def _capture(self, fn: Callable[[], torch.Tensor], pool: Any) -> torch.Tensor:
        """Capture `fn` on the current (side) stream, a new graph after each cut.

        NOTE: a cut's call does not run while capturing (no member runs it then, so no member
        waits): it runs at every replay. Its tensors were allocated by the capture, in the
        memory pool the recordings keep.
        """
        graph = torch.cuda.CUDAGraph()

        def cut(call: Callable[[], None]) -> None:
            nonlocal graph
            graph.capture_end()
            self.segments.append((graph, call))
            graph = torch.cuda.CUDAGraph()
            graph.capture_begin(pool=pool)

        graph.capture_begin(pool=pool)
        try:
            with capture_cuts.cutting(cut):
                out = fn()
        finally:
            graph.capture_end()
        self.segments.append((graph, None))
        return out

    @property
    def cuts(self) -> int:
        """Collectives that run between graphs at each replay."""
        return sum(call is not None for _, call in self.segments)

    def replay(self) -> torch.Tensor:
        if not self.segments:
            self.out = self.fn()
            return self.out
        for graph, call in self.segments:
            graph.replay()
            if call is not None:
                call()
        return self.out


class DecodeGraphs:
    """Recorded decode steps of one context (TP level and rank), by batch-size bucket."""

    captures = 0  # recordings made in this process
    _frozen = False

    def __init__(
        self,
        model: LlamaModel,
        ctx: TPContext,
        pool: KVCache,
        max_context: int,
        buckets: tuple[int, ...] = DEFAULT_BUCKETS,
        memory_pool: object = None,
    ) -> None:
        if DecodeGraphs._frozen:
            raise CaptureAfterStartup("decode graphs are captured at start-up only")
        if pool.scratch_page is None:
            raise ValueError("decode graphs need a KV pool with a scratch page")
        self.model, self.ctx, self.pool = model, ctx, pool
        self.buckets = tuple(sorted(buckets))
        self.page_tokens = pool.tokens_per_page(ctx.tp)
        self.max_pages = -(-max_context // self.page_tokens)
        dev = model.weights.embed.device
        self.cuda = dev.type == "cuda"
        top = self.buckets[-1]
        long: dict[str, Any] = dict(dtype=torch.long, device=dev)
        self.input_ids = torch.zeros(top, **long)
        self.positions = torch.zeros(top, **long)
        self.slots = torch.zeros(top, **long)
        self.pages = torch.zeros(top, self.max_pages, **long)
        self.lens = torch.ones(top, **long)
        # Off CUDA nothing is captured, so a call attends only over the step's own pages.
        self._width, self._max_len = self.max_pages, self.max_pages * self.page_tokens
        self._pad(0)
        self.recordings = {b: Recording(self._step(b), dev, memory_pool) for b in self.buckets}
        self.replays = 0
        DecodeGraphs.captures += len(self.buckets)

    @classmethod
    def freeze(cls) -> None:
        """No capture after this (called once every context's graphs exist)."""
        cls._frozen = True

    def _pad(self, n: int) -> None:
        """Rows from `n` on: token 0 at position 0, one token of context in the scratch page."""
        scratch = self.pool.scratch_page
        assert scratch is not None
        self.input_ids[n:] = 0
        self.positions[n:] = 0
        self.slots[n:] = scratch * self.page_tokens
        self.pages[n:] = scratch
        self.lens[n:] = 1

    def _step(self, b: int) -> Callable[[], torch.Tensor]:
        def step() -> torch.Tensor:
            # NOTE: a plan per call (it caches per-step masks); a CUDA graph records one call,
            # over the whole page table (the Triton kernel bounds its loops on the device).
            width = self.max_pages if self.cuda else self._width
            meta = AttentionMetadata(
                slot_mapping=self.slots[:b],
                page_tokens=self.page_tokens,
                n_decode=b,
                decode_pages=self.pages[:b, :width],
                decode_lens=self.lens[:b],
                decode_max_len=self.max_pages * self.page_tokens if self.cuda else self._max_len,
                prefills=[],
            )
            ids, pos = self.input_ids[:b], self.positions[:b]
            hidden = self.model.forward(self.ctx, ids, pos, meta, self.pool)
            return self.model.logits(hidden)

        return step

    @property
    def cuts(self) -> int:
        """Collectives run between graphs, over every bucket's recording (0 where every
        collective is captured, or off CUDA)."""
        return sum(r.cuts for r in self.recordings.values())

    def fits(self, inputs: StepInputs) -> bool:
        """Whether `inputs` is a plain decode step a recording can run (every row decodes and
        samples, TP mode, within the largest bucket and the page table)."""
        meta = inputs.meta
        n = meta.n_decode
        return (
            n > 0
            and not meta.prefills
            and not inputs.micro
            and not inputs.sequence_parallel
            and n <= self.buckets[-1]
            and len(inputs.sample_rows) == n
            and meta.decode_pages.shape[1] <= self.max_pages
            and meta.page_tokens == self.page_tokens
        )

    def run(self, inputs: StepInputs) -> torch.Tensor:
        """Float32 logits of the step's rows (NOTE: `fits(inputs)` must hold)."""
        meta, n = inputs.meta, inputs.meta.n_decode
        bucket = next(b for b in self.buckets if b >= n)
        width = meta.decode_pages.shape[1]
        self.input_ids[:n].copy_(inputs.input_ids, non_blocking=True)
        self.positions[:n].copy_(inputs.positions, non_blocking=True)
        self.slots[:n].copy_(meta.slot_mapping, non_blocking=True)
        self.pages[:n, :width].copy_(meta.decode_pages, non_blocking=True)
        self.lens[:n].copy_(meta.decode_lens, non_blocking=True)
        self._pad(n)
        self._width, self._max_len = width, meta.decode_max_len
        self.replays += 1
        # NOTE: a copy: the recording's output is overwritten by the next replay.
        return self.recordings[bucket].replay()[:n].clone()
