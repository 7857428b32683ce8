"""Steps recorded piecewise: everything but attention, per token-count bucket (CUDA graphs).

The forward of an L-layer model is L + 1 pieces cut at the attention calls
(`LlamaModel.begin/between/end`): embedding, first norm and layer 0's qkv/rotary/KV write;
then per layer o-proj, residual, norm, MLP and the next layer's norm/qkv/rotary/KV write;
last the final norm. A context's `PiecewiseGraphs` records each piece at start-up for every
token bucket, over static buffers (token ids, positions, KV slots and the `Activations`
handed between pieces). A step copies its inputs into the buffers, pads up to its bucket
and replays the pieces, running attention eagerly between them on the step's real plan
(any mix of decode rows and prefill chunks, any context length): attention sees only the
real rows. Padding rows embed token 0 at position 0 and write their K/V (fused path) to the
pool's scratch page, which no sequence owns. Nothing is recorded after start-up
(`DecodeGraphs.freeze` closes both kinds of recording).

NOTE, the choice of two kinds: pure decode steps keep the whole-forward `DecodeGraphs` (one
replay per step, attention inside, against 2L + 1 launches of replays and eager attention
here); steps with a prefill chunk, or more decode rows or a longer context than those
recordings cover, run piecewise here; sequence-parallel and pipeline steps, and steps past
the largest bucket, run eagerly (`fits`).

Off CUDA the pieces run eagerly over the same static buffers (as `Recording` does): no
speed-up, but the buffer and padding path, which is how CPU tests check it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from nitsum.engine.graphs import CaptureAfterStartup, DecodeGraphs, Recording
from nitsum.engine.step_inputs import StepInputs
from nitsum.kv.cache import KVCache
from nitsum.models.activations import Activations
from nitsum.models.llama import LlamaModel
from nitsum.parallel.context import TPContext
from nitsum_kernels.host_copy import index_on
from nitsum_kernels.paged_attention import AttentionMetadata

DEFAULT_TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def token_buckets(token_budget: int, buckets: tuple[int, ...] = DEFAULT_TOKEN_BUCKETS) -> tuple:
    """The buckets a step of at most `token_budget` tokens needs: those below the budget and
    the first that covers it (every step fits, when the largest bucket does)."""
    ordered = sorted(buckets)
    below = [b for b in ordered if b < token_budget]
    cover = [b for b in ordered if b >= token_budget][:1]
    return tuple(below + cover)


class PiecewiseGraphs:
    """The recorded pieces of one context (TP level and rank), by token bucket."""

    captures = 0  # recordings made in this process (pieces · buckets)

    def __init__(
        self,
        model: LlamaModel,
        ctx: TPContext,
        pool: KVCache,
        buckets: tuple[int, ...] = DEFAULT_TOKEN_BUCKETS,
        memory_pool: object = None,
    ) -> None:
        if DecodeGraphs._frozen:
            raise CaptureAfterStartup("piecewise graphs are captured at start-up only")
        if pool.scratch_page is None:
            raise ValueError("piecewise graphs need a KV pool with a scratch page")
        if ctx.stage is not None:
            raise ValueError("a pipeline stage's steps run eagerly")
        self.model, self.ctx, self.pool = model, ctx, pool
        self.buckets = tuple(sorted(buckets))
        self.page_tokens = pool.tokens_per_page(ctx.tp)
        self.layers = len(ctx.layers)
        dev = model.weights.embed.device
        top, cfg, heads = self.buckets[-1], model.cfg, ctx.heads
        long: dict[str, Any] = dict(dtype=torch.long, device=dev)
        self.input_ids = torch.zeros(top, **long)
        self.positions = torch.zeros(top, **long)
        self.slots = torch.zeros(top, **long)
        hd = cfg.head_dim

        def zeros(*shape: int) -> torch.Tensor:
            return torch.zeros(top, *shape, dtype=model.dtype, device=dev)

        # NOTE: one set of buffers for every bucket (a bucket uses their first rows): pieces
        # write them in place, so a replay reads what the previous piece or attention wrote.
        h, q, o = zeros(cfg.hidden_size), zeros(heads.q_heads, hd), zeros(heads.q_heads * hd)
        unfused = None
        if not model.fused:  # torch rotary: k/v for attention to write, and cos/sin
            kv_heads = heads.kv_heads
            unfused = (zeros(kv_heads, hd), zeros(kv_heads, hd), zeros(1, hd), zeros(1, hd))
        self.acts: dict[int, Activations] = {}
        for b in self.buckets:
            act = Activations(h[:b], static=True)
            act.q, act.o = q[:b], o[:b]
            if unfused is not None:
                act.k, act.v, act.cos, act.sin = (t[:b] for t in unfused)
            self.acts[b] = act
        self._pad(0)
        self.recordings = {
            b: [Recording(self._piece(b, j), dev, memory_pool) for j in range(self.layers + 1)]
            for b in self.buckets
        }
        self.replays = 0
        PiecewiseGraphs.captures += len(self.buckets) * (self.layers + 1)

    def _pad(self, n: int) -> None:
        """Rows from `n` on: token 0 at position 0, K/V to the scratch page's first slot."""
        scratch = self.pool.scratch_page
        assert scratch is not None
        self.input_ids[n:] = 0
        self.positions[n:] = 0
        self.slots[n:] = scratch * self.page_tokens

    def _piece(self, b: int, j: int) -> Callable[[], torch.Tensor]:
        """Piece `j` of bucket `b` (0: up to the first attention; `layers`: after the last)."""
        model, ctx, pool, act = self.model, self.ctx, self.pool, self.acts[b]
        ids, pos, slots = self.input_ids[:b], self.positions[:b], self.slots[:b]

        @torch.inference_mode()
        def piece() -> torch.Tensor:
            if j == 0:
                model.begin(ctx, act, ids, pos, slots, pool, 0)
                return act.h
            if j < self.layers:
                model.between(ctx, act, j - 1, j, pos, slots, pool)
                return act.h
            return model.end(ctx, act, j - 1)

        return piece

    @property
    def cuts(self) -> int:
        """Collectives run between graphs, over every recorded piece (`Recording.cuts`)."""
        return sum(r.cuts for pieces in self.recordings.values() for r in pieces)

    def fits(self, inputs: StepInputs) -> bool:
        """Whether `inputs` is a step the recordings can run: TP mode (not SP, not a
        pipeline's micro-batches), within the largest bucket, at this context's page size."""
        n = inputs.input_ids.shape[0]
        return (
            0 < n <= self.buckets[-1]
            and not inputs.micro
            and not inputs.sequence_parallel
            and not inputs.stage_tp
            and inputs.meta.page_tokens == self.page_tokens
        )

    @torch.inference_mode()
    def run(self, inputs: StepInputs) -> torch.Tensor:
        """Float32 logits of the step's sampled rows (NOTE: `fits(inputs)` must hold)."""
        n = inputs.input_ids.shape[0]
        bucket = next(b for b in self.buckets if b >= n)
        dev = self.input_ids.device
        self.input_ids[:n].copy_(inputs.input_ids, non_blocking=True)
        self.positions[:n].copy_(inputs.positions, non_blocking=True)
        self.slots[:n].copy_(inputs.meta.slot_mapping, non_blocking=True)
        self._pad(n)
        meta: AttentionMetadata = inputs.meta.to(dev)
        pieces, act = self.recordings[bucket], self.acts[bucket]
        for i, piece in enumerate(pieces[:-1]):
            piece.replay()
            self.model.attention(self.ctx, act, i, meta, self.pool)
        hidden = pieces[-1].replay()
        self.replays += 1
        # NOTE: index_select copies: the recording's output is overwritten by the next replay.
        return self.model.logits(hidden.index_select(0, index_on(inputs.sample_rows, dev)))
