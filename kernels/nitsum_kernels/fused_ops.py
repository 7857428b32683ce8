"""The elementwise work of a decoder layer, in torch: the model's CPU path and the reference
the fused Triton kernels (`fused_ops_triton.py`) are tested against.

Three fusions, each a group of ops that reads and writes every token's row once:
- `add_rms_norm`: the residual add fused with the next RMSNorm (HF's fp32 arithmetic);
- `rotary_kv`: RoPE on q and k, with k and v written into the paged KV cache;
- `silu_mul`: SiLU(gate) · up over the interleaved gate/up rows (`weights/layout.py`).

Shapes come from the tensors at call time (a TP shard has fewer heads and a narrower MLP);
nothing here depends on the TP degree.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in float32, as HF does."""
    if x.dtype == torch.float32:  # one fused op, the same arithmetic
        return F.rms_norm(x, weight.shape, weight, eps)
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def add_rms_norm(
    x: torch.Tensor | None, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """`residual += x` (in place, in the model's dtype; skipped when x is None), then the
    RMSNorm of the new residual."""
    if x is not None:
        residual += x
    return rms_norm(residual, weight, eps)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE (HF's rotate-half form) of (..., head_dim) `x`; cos/sin broadcast to it."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def rotary_table(inv_freq: torch.Tensor, positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each (positions, head_dim / 2) float32: the angles of every position, with
    the same float32 products as a per-step `positions.float() * inv_freq`."""
    freqs = torch.arange(positions, device=inv_freq.device).float()[:, None] * inv_freq[None, :]
    return freqs.cos(), freqs.sin()


def rotary_kv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos_table: torch.Tensor,
    sin_table: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    q_out: torch.Tensor,
) -> torch.Tensor:
    """Rotate q (tokens, groups, q_per_group, hd) into `q_out` (tokens, groups·q_per_group,
    hd) and k (tokens, groups, hd); write the rotated k and v (tokens, groups, hd) to the
    flat caches (slots, groups, hd) at `slots`. Returns `q_out`.

    NOTE: inputs may be strided views of one fused qkv row (`weights/layout.py`)."""
    cos = cos_table[positions].repeat(1, 2).to(q.dtype)[:, None]  # (tokens, 1, hd)
    sin = sin_table[positions].repeat(1, 2).to(q.dtype)[:, None]
    rq = apply_rotary(q.flatten(1, 2), cos, sin)
    q_out.copy_(rq)
    k_cache.index_copy_(0, slots, apply_rotary(k, cos, sin))
    v_cache.index_copy_(0, slots, v.contiguous())
    return q_out


def silu_mul(gate_up: torch.Tensor, block: int) -> torch.Tensor:
    """SiLU(gate) · up of (tokens, blocks · 2 · block) rows laid out [gate_b, up_b] per block:
    (tokens, blocks · block)."""
    tokens = gate_up.shape[0]
    gu = gate_up.view(tokens, -1, 2, block)
    return (F.silu(gu[:, :, 0]) * gu[:, :, 1]).reshape(tokens, -1)
