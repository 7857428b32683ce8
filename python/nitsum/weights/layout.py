"""The one full weight copy of a device, stored so any TP shard is a contiguous view.

Layouts (rows are output features, `hd` = head_dim, `r` = query heads per KV head):
- `qkv`:     per KV-head group g: [q heads of g (r·hd rows), k_g (hd), v_g (hd)]. A rank that
             owns whole groups has its q, k and v rows in one contiguous slice; a rank sharing
             a replicated KV head (TP > KV heads) has two: its q rows and [k_g, v_g]
             (parallel/shard.py).
- `o_t`:     o_proj transposed, (H·hd, D): a rank's input features are contiguous rows.
- `gate_up`: the intermediate dim cut into `blocks` blocks, stored [gate_b, up_b] per block,
             so a rank's gate and up rows are one contiguous slice.
- `down_t`:  down_proj transposed, (I, D), block order = intermediate order.
Embeddings, norms and the LM head stay replicated (small; logits need no gather).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from nitsum.config import ModelConfig


@dataclass
class LayerWeights:
    """Full (TP-1) tensors of one decoder layer in the fused layouts above."""

    input_norm: torch.Tensor
    post_norm: torch.Tensor
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    o_t: torch.Tensor
    gate_up: torch.Tensor
    down_t: torch.Tensor
    # Only in the shard of a rank sharing a replicated KV head: the [k_g, v_g] rows (2·hd) of
    # its KV head g, apart from its q rows in `qkv` (views of the same full tensor).
    kv_proj: torch.Tensor | None = None
    kv_bias: torch.Tensor | None = None


@dataclass
class ModelWeights:
    """All weights of a model on one device."""

    embed: torch.Tensor
    layers: list[LayerWeights]
    final_norm: torch.Tensor
    lm_head: torch.Tensor
    mlp_blocks: int
    # The geometry the layouts follow (shard views need it).
    cfg: ModelConfig

    def tensors(self) -> Iterable[torch.Tensor]:
        """Every stored tensor once (tied embeddings count once)."""
        seen: set[int] = set()
        for t in (self.embed, self.final_norm, self.lm_head):
            if id(t) not in seen:
                seen.add(id(t))
                yield t
        for layer in self.layers:
            for t in vars(layer).values():
                if t is not None:
                    yield t

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())


def fuse_qkv(cfg: ModelConfig, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Interleave q/k/v (weights or biases) per KV-head group; works on dim 0."""
    r, hd, kvh = cfg.num_kv_groups, cfg.head_dim, cfg.num_kv_heads
    rest = q.shape[1:]
    q = q.reshape(kvh, r * hd, *rest)
    k = k.reshape(kvh, hd, *rest)
    v = v.reshape(kvh, hd, *rest)
    return torch.cat([q, k, v], dim=1).reshape(kvh * (r + 2) * hd, *rest).contiguous()


def fuse_gate_up(gate: torch.Tensor, up: torch.Tensor, blocks: int) -> torch.Tensor:
    """Interleave gate and up rows in `blocks` blocks: [g_0, u_0, g_1, u_1, ...]."""
    inter, hidden = gate.shape
    g = gate.reshape(blocks, inter // blocks, hidden)
    u = up.reshape(blocks, inter // blocks, hidden)
    return torch.stack([g, u], dim=1).reshape(2 * inter, hidden).contiguous()


def build_weights(
    cfg: ModelConfig,
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    mlp_blocks: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> ModelWeights:
    """Fuse HF-named tensors ("model.layers.0.self_attn.q_proj.weight", ...) into ModelWeights."""
    hf: dict[str, torch.Tensor] = {}
    for name, tensor in named_tensors:
        if "rotary_emb.inv_freq" in name:
            continue
        hf[name] = tensor

    def take(name: str) -> torch.Tensor:
        try:
            return hf.pop(name).to(device=device, dtype=dtype)
        except KeyError:
            raise ValueError(f"checkpoint is missing tensor {name!r}") from None

    layers = []
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        a, m = p + "self_attn.", p + "mlp."
        bias = None
        if cfg.attention_bias:
            bias = fuse_qkv(
                cfg, take(a + "q_proj.bias"), take(a + "k_proj.bias"), take(a + "v_proj.bias")
            )
        layers.append(
            LayerWeights(
                input_norm=take(p + "input_layernorm.weight"),
                post_norm=take(p + "post_attention_layernorm.weight"),
                qkv=fuse_qkv(
                    cfg,
                    take(a + "q_proj.weight"),
                    take(a + "k_proj.weight"),
                    take(a + "v_proj.weight"),
                ),
                qkv_bias=bias,
                o_t=take(a + "o_proj.weight").t().contiguous(),
                gate_up=fuse_gate_up(
                    take(m + "gate_proj.weight"), take(m + "up_proj.weight"), mlp_blocks
                ),
                down_t=take(m + "down_proj.weight").t().contiguous(),
            )
        )
    embed = take("model.embed_tokens.weight")
    if cfg.tie_word_embeddings or "lm_head.weight" not in hf:
        lm_head = embed
        hf.pop("lm_head.weight", None)
    else:
        lm_head = take("lm_head.weight")
    final_norm = take("model.norm.weight")
    if hf:
        raise ValueError(f"unexpected tensors in checkpoint: {sorted(hf)[:5]}")
    return ModelWeights(embed, layers, final_norm, lm_head, mlp_blocks, cfg)
