"""The Llama-family decoder forward pass, run under any TP context.

The model object holds only TP-independent state (config, full weights, rotary tables);
the TP degree, rank, shard views and process group come in with the `TPContext` on every
call, so switching TP is choosing another context.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nitsum.config import ModelConfig
from nitsum.kernels.linear import linear
from nitsum.kernels.paged_attention import AttentionMetadata, paged_attention_ref
from nitsum.kv.pool import KVPool
from nitsum.models.rope import Rotary
from nitsum.parallel.context import TPContext
from nitsum.parallel.sequence import SPComm, TokenSplit
from nitsum.weights.layout import LayerWeights, ModelWeights


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in float32, as HF does."""
    if x.dtype == torch.float32:  # one fused op, the same arithmetic
        return F.rms_norm(x, weight.shape, weight, eps)
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


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
    """Llama / Qwen2 / Mistral decoder over fused, TP-agnostic weights."""

    def __init__(self, cfg: ModelConfig, weights: ModelWeights) -> None:
        self.cfg = cfg
        self.weights = weights
        self.rotary = Rotary(cfg, weights.embed.device)
        self.scale = cfg.head_dim**-0.5
        self.paged_attention = paged_attention_ref
        if weights.embed.is_cuda:  # attend over the pages in place (kernels/)
            from nitsum.kernels.paged_attention_triton import paged_attention_triton

            self.paged_attention = paged_attention_triton

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
        kv: KVPool,
        rows: list[int] | None = None,
        sequence_parallel: bool = False,
    ) -> torch.Tensor:
        """Hidden states after the final norm of the rows `rows` (all when None), identical on
        every rank.

        `sequence_parallel`: run the group's ranks in SP (each runs the dense layers on its
        chunk of the tokens with the full weights; parallel/sequence.py) instead of TP. Both
        write the same KV into the same pages.
        """
        if sequence_parallel and ctx.sp is not None:
            # NOTE: ctx.sp is None in a pipeline (build_context): stages run TP.
            rows = list(range(input_ids.shape[0])) if rows is None else rows
            return self._forward_sp(ctx, ctx.sp, input_ids, positions, meta, kv, rows)
        cfg, stage = self.cfg, ctx.stage
        if stage is None or stage.first:
            h = F.embedding(input_ids, self.weights.embed)
        else:
            h = stage.recv(input_ids.shape[0], cfg.hidden_size, self.weights.embed)
        cos, sin = self.rotary.cos_sin(positions, h.dtype)
        for i in range(len(ctx.layers)) if stage is None else stage.layers:
            layer = ctx.layers[i]
            k_cache, v_cache = kv.kv(i, ctx.heads.kv_heads)
            x = rms_norm(h, layer.input_norm, cfg.rms_norm_eps)
            h += self._attention(ctx, layer, x, cos, sin, k_cache, v_cache, meta)
            x = rms_norm(h, layer.post_norm, cfg.rms_norm_eps)
            h += ctx.all_reduce(self.mlp(layer, x))
        if stage is not None and not stage.last:
            stage.send(h)  # NOTE: only the last stage's hidden states are the step's
            return h[:0]
        h = h if rows is None else h[rows]
        return rms_norm(h, self.weights.final_norm, cfg.rms_norm_eps)

    def _forward_sp(
        self,
        ctx: TPContext,
        sp: SPComm,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv: KVPool,
        rows: list[int],
    ) -> torch.Tensor:
        """The SP forward: dense layers on this rank's chunk with the full weights; attention
        over every token with the rank's own heads (TP's KV layout), between two all-to-alls."""
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

    def _attention(
        self,
        ctx: TPContext,
        layer: LayerWeights,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        groups, r, hd = ctx.heads.kv_heads, self.cfg.num_kv_groups, self.cfg.head_dim
        if layer.kv_proj is not None:
            # A replica of a shared KV head (TP > KV heads): its q rows and the head's k/v
            # rows are two views (parallel/shard.py); the k/v are recomputed on every replica.
            q = linear(x, layer.qkv, layer.qkv_bias).view(-1, ctx.heads.q_heads, hd)
            kv = linear(x, layer.kv_proj, layer.kv_bias).view(-1, 1, 2, hd)
            q, k, v = Rotary.apply(q, cos, sin), Rotary.apply(kv[:, :, 0], cos, sin), kv[:, :, 1]
        else:
            qkv = linear(x, layer.qkv, layer.qkv_bias)
            q, k, v = split_qkv(qkv, groups, r, hd, cos, sin)
        o = self.attend(q, k, v, k_cache, v_cache, meta)
        return ctx.all_reduce(linear(o, layer.o_t.t()))

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
        gu = linear(x, layer.gate_up).view(x.shape[0], -1, 2, block)
        act = (F.silu(gu[:, :, 0]) * gu[:, :, 1]).reshape(x.shape[0], -1)
        return linear(act, layer.down_t.t())
