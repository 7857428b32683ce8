"""The Llama-family decoder forward pass, run under any TP context.

The model object holds only TP-independent state (config, full weights, rotary tables);
the TP degree, rank, shard views and process group come in with the `TPContext` on every
call, so switching TP is choosing another context.

The TP forward is cut at each layer's attention: `begin` (embedding, first norm, layer 0's
qkv and rotary), `between` (o-proj, residual, norm, MLP, the next layer's norm, qkv and
rotary) and `end` (the last o-proj and MLP, final norm), over `Activations`; attention runs
between them (`attention`). `forward` chains them eagerly; engine/piecewise.py records the
pieces per token bucket and runs attention between replays.

The elementwise ops are torch (kernels/fused_ops.py) or, when the weights are on CUDA (or
`fused=True`), fused Triton kernels (kernels/fused_ops_triton.py): the residual add with the
next norm, rotary with the KV-cache write (attention then only reads the cache), SiLU·mul.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from nitsum.config import ModelConfig
from nitsum.kv.cache import KVCache
from nitsum.models.activations import Activations
from nitsum.models.rope import Rotary
from nitsum.parallel.context import TPContext
from nitsum.parallel.ulysses import SPComm, TokenSplit
from nitsum.weights.layout import LayerWeights, ModelWeights
from nitsum_kernels import fused_ops
from nitsum_kernels.fused_ops import rms_norm
from nitsum_kernels.host_copy import index_on
from nitsum_kernels.linear import linear
from nitsum_kernels.paged_attention import AttentionMetadata, paged_attention_ref


def split_qkv(
    qkv: torch.Tensor,
    groups: int,
    q_per_group: int,
    head_dim: int,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q (tokens, groups·q_per_group, hd), k and v (tokens, groups, hd) of fused rows laid out
    per KV group as [its q heads, k, v] (weights/layout.py), with rotary applied to q and k
    (in one pass: they are adjacent in each group)."""
    qkv = qkv.view(-1, groups, q_per_group + 2, head_dim)
    qk = Rotary.apply(qkv[:, :, : q_per_group + 1], cos[:, None], sin[:, None])
    q = qk[:, :, :q_per_group].reshape(-1, groups * q_per_group, head_dim)
    return q, qk[:, :, q_per_group], qkv[:, :, q_per_group + 1]


class LlamaModel:
    """Llama / Qwen2 / Mistral decoder over fused, TP-agnostic weights.

    `fused`: the fused Triton elementwise kernels and Triton attention (None: when the
    weights are on CUDA; True on CPU runs them under Triton's interpreter, for tests)."""

    def __init__(self, cfg: ModelConfig, weights: ModelWeights, fused: bool | None = None) -> None:
        self.cfg = cfg
        self.weights = weights
        self.rotary = Rotary(cfg, weights.embed.device)
        self.scale = cfg.head_dim**-0.5
        self.fused = weights.embed.is_cuda if fused is None else fused
        # NOTE: the Triton entry point also takes `kv_written` (the fused rotary wrote K/V).
        self.paged_attention: Callable[..., torch.Tensor] = paged_attention_ref
        self.add_norm = fused_ops.add_rms_norm
        self.silu_mul = fused_ops.silu_mul
        self.rotary_kv = fused_ops.rotary_kv
        if weights.embed.is_cuda or self.fused:  # attend over the pages in place (kernels/)
            from nitsum_kernels.paged_attention_triton import paged_attention_triton

            self.paged_attention = paged_attention_triton
        if self.fused:
            from nitsum_kernels import fused_ops_triton as tri

            self.add_norm = tri.add_rms_norm_triton
            self.silu_mul = tri.silu_mul_triton
            self.rotary_kv = tri.rotary_kv_triton
            self.rotary.table()  # NOTE: made here, never first inside a graph capture

    @property
    def dtype(self) -> torch.dtype:
        return self.weights.embed.dtype

    @torch.inference_mode()
    def forward(
        self,
        ctx: TPContext,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv: KVCache,
        rows: list[int] | None = None,
        sequence_parallel: bool = False,
    ) -> torch.Tensor:
        """Hidden states after the final norm of the rows `rows` (all when None), identical on
        every rank.

        `sequence_parallel`: run the group's ranks in SP (each runs the dense layers on its
        chunk of the tokens with the full weights; parallel/ulysses.py) instead of TP. Both
        write the same KV into the same pages.
        """
        if sequence_parallel and ctx.sp is not None:
            # NOTE: ctx.sp is None in a pipeline (build_context): stages run TP.
            rows = list(range(input_ids.shape[0])) if rows is None else rows
            return self._forward_sp(ctx, ctx.sp, input_ids, positions, meta, kv, rows)
        stage = ctx.stage
        layers = list(range(len(ctx.layers)) if stage is None else stage.layers)
        slots = meta.slot_mapping
        if stage is None or stage.first:
            act = Activations(F.embedding(input_ids, self.weights.embed))
        else:
            act = Activations(
                stage.recv(input_ids.shape[0], self.cfg.hidden_size, self.weights.embed)
            )
        self.begin(ctx, act, None, positions, slots, kv, layers[0])
        for i, nxt in zip(layers, layers[1:] + [None], strict=True):
            self.attention(ctx, act, i, meta, kv)
            if nxt is not None:
                self.between(ctx, act, i, nxt, positions, slots, kv)
        if stage is not None and not stage.last:
            self.end(ctx, act, layers[-1], norm=False)
            stage.send(act.h)  # NOTE: only the last stage's hidden states are the step's
            return act.h[:0]
        out = self.end(ctx, act, layers[-1])
        return out if rows is None else out.index_select(0, index_on(rows, out.device))

    def begin(
        self,
        ctx: TPContext,
        act: Activations,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        slots: torch.Tensor,
        kv: KVCache,
        layer: int = 0,
    ) -> None:
        """The piece before the first attention: the embedding of `input_ids` into `act.h`
        (None: `act.h` holds the step's input already), the first norm, `layer`'s q/k/v."""
        if input_ids is not None:
            act.put("h", F.embedding(input_ids, self.weights.embed))
        if not self.fused:
            act.put("cos", (cs := self.rotary.cos_sin(positions, act.h.dtype))[0])
            act.put("sin", cs[1])
        x = self.add_norm(None, act.h, ctx.layers[layer].input_norm, self.cfg.rms_norm_eps)
        self._qkv(ctx, act, layer, x, positions, slots, kv)

    def between(
        self,
        ctx: TPContext,
        act: Activations,
        layer: int,
        nxt: int,
        positions: torch.Tensor,
        slots: torch.Tensor,
        kv: KVCache,
    ) -> None:
        """The piece between `layer`'s attention and `nxt`'s: o-proj and MLP of `layer`, the
        residual adds fused with the norms, `nxt`'s q/k/v."""
        x = self._finish(ctx, act, layer, ctx.layers[nxt].input_norm)
        assert x is not None
        self._qkv(ctx, act, nxt, x, positions, slots, kv)

    def end(self, ctx: TPContext, act: Activations, layer: int, norm: bool = True) -> torch.Tensor:
        """The piece after the last attention: `layer`'s o-proj and MLP and the final norm
        (`norm=False`: the residual stream `act.h` itself, a pipeline stage's output)."""
        x = self._finish(ctx, act, layer, self.weights.final_norm if norm else None)
        return act.h if x is None else x

    def _finish(
        self, ctx: TPContext, act: Activations, i: int, next_norm: torch.Tensor | None
    ) -> torch.Tensor | None:
        """o-proj, residual, post norm, MLP, residual, then `next_norm` of the new residual
        (None: no norm; the residual stream is complete)."""
        layer, eps = ctx.layers[i], self.cfg.rms_norm_eps
        assert act.o is not None
        attn = ctx.all_reduce(linear(act.o, layer.o_t.t()))
        x = self.add_norm(attn, act.h, layer.post_norm, eps)
        mlp = ctx.all_reduce(self.mlp(layer, x))
        if next_norm is None:
            act.h += mlp
            return None
        return self.add_norm(mlp, act.h, next_norm, eps)

    def attention(
        self, ctx: TPContext, act: Activations, i: int, meta: AttentionMetadata, kv: KVCache
    ) -> None:
        """Layer `i`'s paged attention of the step's rows (the first `len(slot_mapping)` of
        `act`; any further rows are a bucket's padding) into `act.o`."""
        k_cache, v_cache = kv.kv(i, ctx.heads.kv_heads)
        n = meta.slot_mapping.shape[0]
        assert act.q is not None
        if act.k is None or act.v is None:  # the fused rotary kernel wrote K/V
            o = self.paged_attention(
                act.q[:n], None, None, k_cache, v_cache, meta, self.scale, kv_written=True
            ).view(n, -1)
        else:
            o = self.attend(act.q[:n], act.k[:n], act.v[:n], k_cache, v_cache, meta)
        act.put("o", o)

    def _qkv(
        self,
        ctx: TPContext,
        act: Activations,
        i: int,
        x: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        kv: KVCache,
    ) -> None:
        """Layer `i`'s q (rotated) into `act.q`; k (rotated) and v into the cache (fused)
        or into `act.k`/`act.v` for attention to write (torch)."""
        layer, tokens, hd = ctx.layers[i], x.shape[0], self.cfg.head_dim
        groups, r = ctx.heads.kv_heads, self.cfg.num_kv_groups
        if layer.kv_proj is not None:
            # A replica of a shared KV head (TP > KV heads): its q rows and the head's k/v
            # rows are two views (parallel/shard.py); the k/v are recomputed on every replica.
            q = linear(x, layer.qkv, layer.qkv_bias).view(tokens, 1, ctx.heads.q_heads, hd)
            kvr = linear(x, layer.kv_proj, layer.kv_bias).view(tokens, 1, 2, hd)
            k, v = kvr[:, :, 0], kvr[:, :, 1]
        else:
            qkv = linear(x, layer.qkv, layer.qkv_bias).view(tokens, groups, r + 2, hd)
            q, k, v = qkv[:, :, :r], qkv[:, :, r], qkv[:, :, r + 1]
        if self.fused:
            cos, sin = self.rotary.table()
            k_cache, v_cache = kv.kv(i, ctx.heads.kv_heads)
            q_out = act.out("q", (tokens, ctx.heads.q_heads, hd), x)
            self.rotary_kv(q, k, v, positions, cos, sin, k_cache, v_cache, slots, q_out)
            return
        assert act.cos is not None and act.sin is not None
        cos, sin = act.cos[:tokens], act.sin[:tokens]
        if layer.kv_proj is not None:
            q = Rotary.apply(q.view(tokens, -1, hd), cos, sin)
            k = Rotary.apply(k, cos, sin)
        else:
            q, k, v = split_qkv(qkv, groups, r, hd, cos, sin)
        act.put("q", q)
        act.put("k", k)
        act.put("v", v)

    def _forward_sp(
        self,
        ctx: TPContext,
        sp: SPComm,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv: KVCache,
        rows: list[int],
    ) -> torch.Tensor:
        """The SP forward: dense layers on this rank's chunk with the full weights; attention
        over every token with the rank's own heads (TP's KV layout), between two all-to-alls.
        (Unfused norms and rotary: attention writes the K/V after the all-to-all.)"""
        cfg, hd, heads = self.cfg, self.cfg.head_dim, ctx.heads
        split = TokenSplit(input_ids.shape[0], sp.ranks)
        h = F.embedding(split.take(input_ids, sp.rank), self.weights.embed)
        # Rotary runs after the all-to-all, on every token, as in TP.
        cos, sin = self.rotary.cos_sin(positions, h.dtype)
        q_per_group = heads.q_heads // heads.kv_heads
        for i, layer in enumerate(self.weights.layers):
            k_cache, v_cache = kv.kv(i, heads.kv_heads)
            x = rms_norm(h, layer.input_norm, cfg.rms_norm_eps)
            qkv = sp.scatter_heads(linear(x, layer.qkv, layer.qkv_bias), split, hd)
            q, k, v = split_qkv(qkv, heads.kv_heads, q_per_group, hd, cos, sin)
            o = self.attend(q, k, v, k_cache, v_cache, meta)
            h = h + linear(sp.gather_tokens(o, split), layer.o_t.t())
            x = rms_norm(h, layer.post_norm, cfg.rms_norm_eps)
            h = h + self.mlp(layer, x)
        h = sp.gather_rows(h, split, rows)
        return rms_norm(h, self.weights.final_norm, cfg.rms_norm_eps)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits for the given rows (LM head is replicated on every rank)."""
        return linear(hidden, self.weights.lm_head).float()

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """KV write and paged attention over a rank's own heads of every token (q and k
        rotated): (tokens, heads·hd). The same under TP and SP (the KV layout is the same)."""
        o = self.paged_attention(q, k, v.contiguous(), k_cache, v_cache, meta, self.scale)
        return o.view(o.shape[0], -1)

    def mlp(self, layer: LayerWeights, x: torch.Tensor) -> torch.Tensor:
        """The MLP over `layer`'s rows: partial sums for a TP shard, whole for full weights."""
        block = self.cfg.intermediate_size // self.weights.mlp_blocks
        act = self.silu_mul(linear(x, layer.gate_up), block)
        return linear(act, layer.down_t.t())
