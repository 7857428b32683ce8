"""Analytic (roofline) profiles for GPUs we cannot measure, marked `"analytic": true`.

Writes the `nitsum-profile/1` schema (docs/profile-schema.md). Assumptions, per TP level `t`:

- prefill of `n` tokens: compute time `(2·P·n + 2·L·n²·d) / t / (peak · MFU)` (dense matmuls
  plus causal attention), at least the weight read `W / t / (HBM · eff)`; plus 2 all-reduces
  per layer of `n·d·2` bytes (ring: `2(t-1)/t · bytes / NVLink + α`); plus a fixed launch
  overhead per forward.
- decode step of `b` sequences at context `c`: memory time `(W + b·c·KV) / t / (HBM · eff)`
  (weights and KV cache read once per step), at least the compute `2·P·b / t / (peak · MFU)`;
  plus the same all-reduces on `b·d·2` bytes; plus a smaller (graph-captured) overhead.
- decode points whose KV cache would not fit in `0.9 · memory − W / t` are left out.

These are estimates for planning and simulation only; measured profiles replace them.
`python -m nitsum.profiling.analytic --gpu h100 --model llama3-8b --out PATH`
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from datetime import date
from pathlib import Path


@dataclass(frozen=True)
class Gpu:
    name: str
    peak_tflops: float  # dense fp16/bf16
    hbm_tbps: float
    nvlink_gbps: float  # per-GPU all-reduce bus bandwidth, GB/s
    memory_gb: float


@dataclass(frozen=True)
class Model:
    name: str
    params_b: float
    layers: int
    hidden: int
    kv_heads: int
    head_dim: int
    max_context: int

    @property
    def weight_bytes(self) -> float:
        return self.params_b * 1e9 * 2  # fp16

    @property
    def kv_bytes_per_token(self) -> float:
        return 2 * self.layers * self.kv_heads * self.head_dim * 2  # K and V, fp16


GPUS = {
    "h100": Gpu("h100-80gb-sxm", 989.0, 3.35, 450.0, 80.0),
    "a100": Gpu("a100-80gb-sxm", 312.0, 2.0, 300.0, 80.0),
    # The H100's compute and NVLink with 141 GB of HBM3e at 4.8 TB/s.
    "h200": Gpu("h200-141gb-sxm", 989.0, 4.8, 450.0, 141.0),
}


def gpu_of_device(name: str) -> Gpu | None:
    """The spec sheet of a CUDA device by its name (`torch.cuda.get_device_name()`), or None
    for a device not listed. NOTE: H100 names a PCIe and an NVL card too, whose HBM is
    slower (2.0, 3.9 TB/s): only the SXM part ("H100 80GB HBM3", "H100 SXM") is `h100`."""
    upper = name.upper()
    if "H200" in upper:
        return GPUS["h200"]
    if "H100" in upper and ("HBM3" in upper or "SXM" in upper) and "NVL" not in upper:
        return GPUS["h100"]
    return None


MODELS = {
    "llama3-8b": Model("Llama-3.1-8B", 8.03, 32, 4096, 8, 128, 8192),
    "qwen-14b": Model("DeepSeek-R1-Distill-Qwen-14B", 14.8, 48, 5120, 8, 128, 8192),
    # gpu_check's random model (scripts/random_model.py): Llama-3-8B's layers, SmolLM2's vocab.
    "llama3-8b-shape-v49k": Model("Llama-3-8B shape, vocab 49152", 7.38, 32, 4096, 8, 128, 8192),
}
MFU = 0.6  # achievable fraction of peak on large prefill GEMMs
HBM_EFF = 0.8  # achievable fraction of HBM bandwidth
ALLREDUCE_ALPHA_MS = 0.01  # per all-reduce latency
PREFILL_OVERHEAD_MS = 1.0
DECODE_OVERHEAD_MS = 0.3
TOKENS = [64, 128, 256, 512, 1024, 2048, 4096, 8192]
BATCHES = [1, 2, 4, 8, 16, 32, 64, 128, 256]
CONTEXTS = [256, 1024, 2048, 4096, 8192]


def _allreduce_ms(gpu: Gpu, model: Model, tp: int, tokens: int) -> float:
    if tp == 1:
        return 0.0
    nbytes = tokens * model.hidden * 2
    one = ALLREDUCE_ALPHA_MS + 2 * (tp - 1) / tp * nbytes / (gpu.nvlink_gbps * 1e9) * 1e3
    return 2 * model.layers * one


def prefill_ms(gpu: Gpu, model: Model, tp: int, n: int) -> float:
    flops = 2 * model.params_b * 1e9 * n + 2 * model.layers * n * n * model.hidden
    compute = flops / tp / (gpu.peak_tflops * 1e12 * MFU) * 1e3
    memory = model.weight_bytes / tp / (gpu.hbm_tbps * 1e12 * HBM_EFF) * 1e3
    return max(compute, memory) + _allreduce_ms(gpu, model, tp, n) + PREFILL_OVERHEAD_MS


def decode_ms(gpu: Gpu, model: Model, tp: int, b: int, c: int) -> float:
    nbytes = model.weight_bytes + b * c * model.kv_bytes_per_token
    memory = nbytes / tp / (gpu.hbm_tbps * 1e12 * HBM_EFF) * 1e3
    compute = 2 * model.params_b * 1e9 * b / tp / (gpu.peak_tflops * 1e12 * MFU) * 1e3
    return max(memory, compute) + _allreduce_ms(gpu, model, tp, b) + DECODE_OVERHEAD_MS


def kv_fits(gpu: Gpu, model: Model, tp: int, b: int, c: int) -> bool:
    free = 0.9 * gpu.memory_gb * 1e9 - model.weight_bytes / tp
    return b * c * model.kv_bytes_per_token / tp <= free


def profile(gpu_key: str, model_key: str, tp_levels: list[int]) -> dict:
    gpu, model = GPUS[gpu_key], MODELS[model_key]
    r = lambda x: round(x, 4)  # noqa: E731
    return {
        "schema": "nitsum-profile/1",
        "device": gpu.name,
        "model": model.name,
        "dtype": "float16",
        "analytic": True,
        "date": date.today().isoformat(),
        "versions": {"nitsum": "0.1.0", "generator": "nitsum.profiling.analytic"},
        "assumptions": {
            "peak_tflops": gpu.peak_tflops,
            "mfu": MFU,
            "hbm_tbps": gpu.hbm_tbps,
            "hbm_efficiency": HBM_EFF,
            "allreduce_gbps": gpu.nvlink_gbps,
            "allreduce_alpha_ms": ALLREDUCE_ALPHA_MS,
            "allreduces_per_layer": 2,
            "prefill_overhead_ms": PREFILL_OVERHEAD_MS,
            "decode_overhead_ms": DECODE_OVERHEAD_MS,
            "kv_bytes_per_token": model.kv_bytes_per_token,
        },
        "max_context": model.max_context,
        "tp_levels": tp_levels,
        "prefill": {
            str(t): [{"tokens": n, "ms": r(prefill_ms(gpu, model, t, n))} for n in TOKENS]
            for t in tp_levels
        },
        "decode": {
            str(t): [
                {"batch": b, "context": c, "ms": r(decode_ms(gpu, model, t, b, c))}
                for c in CONTEXTS
                for b in BATCHES
                if kv_fits(gpu, model, t, b, c)
            ]
            for t in tp_levels
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="nitsum-analytic-profile", description=__doc__)
    p.add_argument("--gpu", choices=sorted(GPUS), default="h100")
    p.add_argument("--model", choices=sorted(MODELS), default="llama3-8b")
    p.add_argument("--tp", default="1,2,4,8", help="comma-separated TP levels")
    p.add_argument("--out", help="output path (default: stdout)")
    args = p.parse_args(argv)
    levels = [int(x) for x in args.tp.split(",")]
    model = MODELS[args.model]
    bad = [t for t in levels if t < 1 or model.kv_heads % t]
    if bad:
        print(f"error: TP {bad} must divide the {model.kv_heads} KV heads", file=sys.stderr)
        return 2
    text = json.dumps(profile(args.gpu, args.model, levels), indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
