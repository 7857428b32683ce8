"""Prefill speed on a GPU, against the GPU's own matmul rate, in one run.

A Llama-3-8B-shaped model with random weights (hidden 4096, 32 query / 8 KV heads of 128,
MLP 14336, 32 layers, vocab 128256; nothing is downloaded), bf16:

1. gemm: a bf16 `torch.mm` of 8192 × 8192 × 8192, the rate the GPU reaches on big matmuls;
2. prefill: one fresh 2,048-token prompt of random ids as `nitsum profile --device cuda`
   measures a prefill point (profiling/measure.py's GroupStep on the engine it builds,
   profiling/engine_profile.py: launch and collect the step, i.e. the forward, the last
   row's logits and its sampling, synchronized), its FLOPs counted as
   2 · (linear weights) · tokens plus causal attention, 4 · L² · head_dim · q_heads / 2 per
   layer, plus the LM head's row; the achieved TFLOP/s and its share of the gemm rate
   (target: >= 50%);
3. prefill_constant_ids: the same step on 2,048 copies of token 1, the prompt the 2026-11-27
   H200 profile measured (45.1 ms there against 50.6 ms here on random ids): every row of
   every matmul input is then the same vector, and the ratio of the two rows is what such
   predictable data gains on this GPU (docs/gpu.md, "Prefill: the profile against
   bench_prefill");
4. attention alone for the same prompt, one layer: the Triton varlen prefill kernel over the
   pages (kernels/prefill_attention_triton.py) against SDPA's flash backend on contiguous
   K/V of the same shapes (GQA), and their largest difference.

`--json PATH` writes the rows. Without CUDA the script refuses, unless `--device cpu --tiny`
(a tiny model, the Triton kernel in its interpreter): that only shows the script runs, its
timings mean nothing and every row says so.

    python scripts/bench_prefill.py [--prompt 2048] [--json prefill.json]
    python scripts/bench_prefill.py --device cpu --tiny
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:  # NOTE: nitsum imports wait for main (TRITON_INTERPRET must come first)
    from nitsum.config import ModelConfig
    from nitsum.pool.pool_engine import PoolEngine
    from nitsum_kernels.paged_attention import AttentionMetadata

TARGET = 0.5  # of the GEMM rate, for the whole prefill forward
Runner = Callable[[Callable[[], object]], float]  # seconds of one call (median)


def timed(fn: Callable[[], object], device: str, warmup: int, repeats: int) -> float:
    """Median seconds of `fn` over `repeats` runs after `warmup` (synchronized on CUDA)."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def profile_engine(shape: str, device: str, n: int) -> PoolEngine:
    """The engine `nitsum profile --device cuda` builds (profiling/engine_profile.py), bf16,
    over a random HF Llama of `shape`, with KV for one n-token prompt."""
    from dataclasses import replace

    from model_shapes import random_llama  # scripts/ is on the path
    from nitsum.config import ModelConfig
    from nitsum.engine.piecewise import token_buckets
    from nitsum.kv.cache import KVCache
    from nitsum.pool.local import local_engine
    from nitsum.profiling.engine_profile import profile_engine_config

    layers = {"num_hidden_layers": 2} if shape == "tiny" else {}
    hf, hf_cfg = random_llama(shape, device, torch.bfloat16, **layers)
    cfg = ModelConfig.from_hf(hf_cfg.to_dict() | {"architectures": ["LlamaForCausalLM"]})
    kv = KVCache.page_bytes_of(cfg, 16, torch.bfloat16) * (n // 16 + 16)
    ecfg = profile_engine_config(device, torch.bfloat16, max(kv, 64 << 20), n)
    if n > max(token_buckets(ecfg.token_budget)):
        # NOTE: a step past the largest recorded bucket runs eagerly in the profile too
        # (engine/piecewise.py): its recordings would cost start-up and never replay.
        ecfg = replace(ecfg, decode_graphs=False, piecewise_graphs=False)
    return local_engine(cfg, hf.state_dict().items(), ecfg)


def fresh_prompt_plan(pages: list[int], n: int, page_tokens: int) -> AttentionMetadata:
    """The host-side plan (AttentionMetadata) of one fresh n-token prompt in `pages`, as
    build_step_inputs makes it."""
    from nitsum.kv.pages import context_slots
    from nitsum_kernels.paged_attention import AttentionMetadata, PrefillSegment

    return AttentionMetadata(
        slot_mapping=context_slots(pages, n, page_tokens),
        page_tokens=page_tokens,
        n_decode=0,
        decode_pages=torch.zeros(0, 0, dtype=torch.long),
        decode_lens=torch.zeros(0, dtype=torch.long),
        decode_max_len=0,
        prefills=[PrefillSegment(0, n, n, torch.tensor(pages, dtype=torch.long))],
    )


def prefill_flops(cfg: ModelConfig, n: int) -> float:
    """FLOPs of one n-token prefill: every linear layer over n rows, the LM head over the
    last row, causal attention (half of 4 · n² · hd · q_heads) per layer."""
    hd, hq, hkv = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
    per_layer = (
        cfg.hidden_size * hd * (2 * hq + 2 * hkv) + 3 * cfg.hidden_size * cfg.intermediate_size
    )
    attention = 4 * n * n * hd * hq / 2
    return cfg.num_layers * (2 * per_layer * n + attention) + 2 * cfg.hidden_size * cfg.vocab_size


def gemm_row(dev: str, run: Runner) -> dict:
    """The bf16 rate of one big square matmul."""
    size = 8192 if dev.startswith("cuda") else 256
    a = torch.randn(size, size, device=dev, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=dev, dtype=torch.bfloat16)
    t = run(lambda: torch.mm(a, b))
    return dict(name="gemm", m=size, n=size, k=size, ms=t * 1e3, tflops=2 * size**3 / t / 1e12)


def prefill_rows(dev: str, run: Runner, n: int) -> tuple[list[dict], ModelConfig]:
    """The profile's prefill point of n tokens (profiling/measure.py's GroupStep), on random
    ids and on n copies of token 1 (the 2026-11-27 profile's prompt)."""
    from nitsum.parallel.topology import GroupShape
    from nitsum.profiling.measure import GroupStep

    pe = profile_engine("8b" if dev.startswith("cuda") else "tiny", dev, n)
    cfg, flops = pe.cfg, prefill_flops(pe.cfg, n)
    rows = []
    try:
        for name, constant in (("prefill", False), ("prefill_constant_ids", True)):
            step = GroupStep(pe, GroupShape.tp_group((0,)), [(n, n)], constant_ids=constant)
            t = run(step)
            step.release()
            rows.append(
                dict(name=name, tokens=n, ms=t * 1e3, tflop=flops / 1e12, tflops=flops / t / 1e12)
            )
    finally:
        pe.pool.close()
    return rows, cfg


def attention_rows(dev: str, run: Runner, cfg: ModelConfig, n: int, page: int) -> list[dict]:
    """One layer's attention over a fresh n-token prompt: the Triton kernel over scattered
    pages against SDPA (flash on CUDA) on contiguous K/V of the same shapes."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from nitsum_kernels.prefill_attention_triton import prefill_attention_triton

    hq, hkv, hd, dtype = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, torch.bfloat16
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(n, h, hd, generator=g).to(dev, dtype) for h in (hq, hkv, hkv))
    n_pages = -(-n // page)
    meta = fresh_prompt_plan(torch.randperm(n_pages, generator=g).tolist(), n, page).to(dev)
    k_cache = torch.zeros(n_pages * page, hkv, hd, device=dev, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    k_cache[meta.slot_mapping], v_cache[meta.slot_mapping] = k, v
    out = torch.empty_like(q)
    scale = hd**-0.5
    t_kernel = run(lambda: prefill_attention_triton(q, k_cache, v_cache, meta, scale, out))
    qs, ks, vs = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))
    backend = SDPBackend.FLASH_ATTENTION if dev.startswith("cuda") else SDPBackend.MATH

    def sdpa() -> torch.Tensor:
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(
                qs, ks, vs, is_causal=True, scale=scale, enable_gqa=True
            )

    t_sdpa = run(sdpa)
    diff = (out.float() - sdpa()[0].transpose(0, 1).float()).abs().max().item()
    flops = 4 * n * n * hd * hq / 2
    return [
        dict(name="attention_triton", tokens=n, ms=t_kernel * 1e3, tflops=flops / t_kernel / 1e12,
             max_abs_diff_vs_sdpa=diff, vs_sdpa=t_sdpa / t_kernel),
        dict(name=f"attention_sdpa_{backend.name.lower()}", tokens=n, ms=t_sdpa * 1e3,
             tflops=flops / t_sdpa / 1e12),
    ]  # fmt: skip


def bench(args: argparse.Namespace) -> list[dict]:
    """Every row of the run, in order; `of_gemm` on the prefill rows, `vs_random_ids` on the
    constant-ids one (its time over the random ids' one)."""
    run: Runner = lambda fn: timed(fn, args.device, args.warmup, args.repeats)  # noqa: E731
    gemm = gemm_row(args.device, run)
    (prefill, constant), cfg = prefill_rows(args.device, run, args.prompt)
    for row in (prefill, constant):
        row["of_gemm"] = row["tflops"] / gemm["tflops"]
    constant["vs_random_ids"] = constant["ms"] / prefill["ms"]
    attention = attention_rows(args.device, run, cfg, args.prompt, args.page_tokens)
    rows = [gemm, prefill, constant, *attention]
    if not args.device.startswith("cuda"):
        for row in rows:
            row["note"] = "CPU --tiny: checks the script runs; timings mean nothing"
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny model (with --device cpu)")
    ap.add_argument("--prompt", type=int, default=None, help="tokens (2048; 128 with --tiny)")
    ap.add_argument("--page-tokens", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", metavar="PATH", help="write the rows here")
    args = ap.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("bench_prefill: no CUDA device (for a check of the script: --device cpu --tiny)")
    if not args.device.startswith("cuda"):
        if not (args.device == "cpu" and args.tiny):
            sys.exit(
                "bench_prefill: off CUDA only `--device cpu --tiny` runs (timings meaningless)"
            )
        # NOTE: before triton is first imported: the kernel runs in Triton's interpreter,
        # whose bf16 dots the kernel tests' helper fixes (kernels/tests/triton_interpret.py).
        os.environ["TRITON_INTERPRET"] = "1"
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "kernels" / "tests"))
        from triton_interpret import widen_bf16_dots

        widen_bf16_dots()
    args.prompt = args.prompt or (128 if args.tiny else 2048)
    rows = bench(args)
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(f"prefill bench on {device}, torch {torch.__version__}, bf16, {args.prompt} tokens")
    for row in rows:
        cells = (f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items())
        print("  " + ", ".join(cells))
    gemm, prefill, constant, kernel, sdpa = rows
    verdict = "met" if prefill["of_gemm"] >= TARGET else "missed"
    if not args.device.startswith("cuda"):
        print("(CPU --tiny: the lines below only show the script runs)")
    print(
        f"[prefill] {prefill['tflops']:.1f} TFLOP/s = {prefill['of_gemm']:.0%} of the bf16 GEMM "
        f"rate ({gemm['tflops']:.1f} TFLOP/s); target {TARGET:.0%}: {verdict}"
    )
    print(
        f"[prefill] {prefill['ms']:.1f} ms on random ids, {constant['ms']:.1f} ms on "
        f"{args.prompt} copies of one id ({constant['vs_random_ids']:.2f}x)"
    )
    print(
        f"[attention] Triton {kernel['ms']:.3f} ms ({kernel['tflops']:.1f} TFLOP/s) vs "
        f"{sdpa['name']} {sdpa['ms']:.3f} ms: {kernel['vs_sdpa']:.2f}x its speed, "
        f"max |diff| {kernel['max_abs_diff_vs_sdpa']:.3g}"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device, "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
