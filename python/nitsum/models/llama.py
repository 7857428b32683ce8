"""The Llama-family decoder forward pass, run under any TP context.

The model object holds only TP-independent state (config, full weights, rotary tables);
the TP degree, rank, shard views and process group come in with the `TPContext` on every
call, so switching TP is choosing another context.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nitsum.config import ModelConfig
from nitsum.kernels.paged_attention import AttentionMetadata, paged_attention_ref
from nitsum.kv.pool import KVPool
from nitsum.models.rope import Rotary
from nitsum.parallel.context import TPContext
from nitsum.weights.layout import LayerWeights, ModelWeights


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in float32, as HF does."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


class LlamaModel:
    """Llama / Qwen2 / Mistral decoder over fused, TP-agnostic weights."""

    def __init__(self, cfg: ModelConfig, weights: ModelWeights) -> None:
        self.cfg = cfg
        self.weights = weights
        self.rotary = Rotary(cfg, weights.embed.device)
        self.scale = cfg.head_dim**-0.5

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
    ) -> torch.Tensor:
        """Hidden states (tokens, hidden) after the final norm; identical on every rank."""
        cfg = self.cfg
        h = F.embedding(input_ids, self.weights.embed)
        cos, sin = self.rotary.cos_sin(positions, h.dtype)
        for i, layer in enumerate(ctx.layers):
            k_cache, v_cache = kv.kv(i, ctx.heads.kv_heads)
            x = rms_norm(h, layer.input_norm, cfg.rms_norm_eps)
            h = h + self._attention(ctx, layer, x, cos, sin, k_cache, v_cache, meta)
            x = rms_norm(h, layer.post_norm, cfg.rms_norm_eps)
            h = h + self._mlp(ctx, layer, x)
        return rms_norm(h, self.weights.final_norm, cfg.rms_norm_eps)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits for the given rows (LM head is replicated on every rank)."""
        return F.linear(hidden, self.weights.lm_head).float()

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
        qkv = F.linear(x, layer.qkv, layer.qkv_bias).view(-1, groups, r + 2, hd)
        q = qkv[:, :, :r].reshape(-1, groups * r, hd)
        k, v = qkv[:, :, r], qkv[:, :, r + 1]
        q = Rotary.apply(q, cos, sin)
        k = Rotary.apply(k, cos, sin)
        o = paged_attention_ref(q, k, v.contiguous(), k_cache, v_cache, meta, self.scale)
        return ctx.all_reduce(o.view(o.shape[0], -1) @ layer.o_t)

    def _mlp(self, ctx: TPContext, layer: LayerWeights, x: torch.Tensor) -> torch.Tensor:
        block = self.cfg.intermediate_size // self.weights.mlp_blocks
        gu = F.linear(x, layer.gate_up).view(x.shape[0], -1, 2, block)
        act = (F.silu(gu[:, :, 0]) * gu[:, :, 1]).reshape(x.shape[0], -1)
        return ctx.all_reduce(act @ layer.down_t)
