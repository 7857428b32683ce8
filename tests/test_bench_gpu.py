"""scripts/bench_gpu.py's arithmetic, which needs no GPU: the bytes a decode step must read
(weights + KV), its floor at the copy rate, and the bandwidth reached as % of the copy rate
and of the device's spec sheet, looked up by the device's name."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest
import torch

from nitsum.config import ModelConfig
from nitsum.profiling.analytic import gpu_of_device

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import bench_gpu  # noqa: E402
from model_shapes import SHAPES  # noqa: E402


def test_a_step_against_the_weights_and_kv_it_reads():
    cfg = ModelConfig.from_hf(SHAPES["8b"] | {"architectures": ["LlamaForCausalLM"]})
    kv_token = bench_gpu.kv_bytes_per_token(cfg, torch.bfloat16)
    assert kv_token == 32 * 2 * 8 * 128 * 2  # 128 KiB a token: 32 layers, K and V
    # Batch 64 at 2,048-token prompts: the KV of 64 x 2,080 tokens outweighs 15 GB of weights.
    kv = 64 * (2048 + 32) * kv_token
    p = bench_gpu.decode_floor(64, 8000.0, 15 * 10**9, kv, 4.2e12, 4.8e12)
    moved = 15e9 + kv
    assert p["step_ms"] == pytest.approx(8.0)
    assert p["floor_ms"] == pytest.approx(moved / 4.2e12 * 1e3)
    assert p["floor_ratio"] == pytest.approx(8e-3 / (moved / 4.2e12))
    assert p["pct_copy"] == pytest.approx(100 * moved / 8e-3 / 4.2e12)
    assert p["pct_spec"] == pytest.approx(100 * moved / 8e-3 / 4.8e12)
    assert p["pct_copy"] == pytest.approx(100 / p["floor_ratio"])
    assert bench_gpu.decode_floor(1, 200.0, 10**9, 0, 1e12, None)["pct_spec"] is None


def test_points_and_spec_sheets_by_device_name():
    assert bench_gpu.parse_point("64x2048") == (64, 2048)
    for bad in ("64", "0x1024", "x", "8 x 8"):
        with pytest.raises(argparse.ArgumentTypeError):
            bench_gpu.parse_point(bad)
    assert gpu_of_device("NVIDIA H200").hbm_tbps == 4.8  # type: ignore[union-attr]
    assert gpu_of_device("NVIDIA H100 80GB HBM3").hbm_tbps == 3.35  # type: ignore[union-attr]
    # Slower-memory H100s and unknown devices get no spec figure rather than a wrong one.
    assert gpu_of_device("NVIDIA H100 PCIe") is None
    assert gpu_of_device("NVIDIA H100 NVL") is None
    assert gpu_of_device("NVIDIA A10G") is None
