"""Rotary position embeddings (default, linear and llama3 scaling), HF-compatible numerics."""

from __future__ import annotations

import math

import torch

from nitsum.config import ModelConfig
from nitsum_kernels.fused_ops import apply_rotary, rotary_table


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Inverse frequencies (head_dim/2,) in float32, with the configured scaling applied."""
    hd = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    scaling = cfg.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind in (None, "default"):
        return inv
    if kind == "linear":
        return inv / scaling["factor"]
    if kind == "llama3":
        factor = scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_ctx = scaling["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled)
    raise ValueError(f"unsupported rope scaling type {kind!r}")


class Rotary:
    """Applies RoPE to (tokens, heads, head_dim) tensors at given positions."""

    def __init__(self, cfg: ModelConfig, device: torch.device | str = "cpu") -> None:
        self.inv_freq = rope_inv_freq(cfg).to(device)
        self.max_positions = cfg.max_position_embeddings
        self._table: tuple[torch.Tensor, torch.Tensor] | None = None

    def cos_sin(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin of shape (tokens, 1, head_dim), computed in float32 like HF."""
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos().to(dtype)[:, None, :], emb.sin().to(dtype)[:, None, :]

    def table(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) of every position, (max_positions, head_dim / 2) float32, made on first
        use (the fused rotary kernel looks its tokens' rows up: no per-step angle ops)."""
        if self._table is None:
            self._table = rotary_table(self.inv_freq, self.max_positions)
        return self._table

    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return apply_rotary(x, cos, sin)
