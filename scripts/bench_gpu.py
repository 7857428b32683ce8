"""The engine on a GPU, side by side in one run (for a session that is lent one).

A Llama-3-8B-shaped model with random weights (nothing is downloaded; vocab 128,256), bf16:
1. decode tok/s at each point BATCHxPROMPT (default 1x1024, 16x1024, 64x1024, 64x2048: the
   shapes vLLM's and SGLang's decode numbers are quoted at), 64 new tokens, EOS ignored,
   decode-only (the steps once every request has its first token): the engine with recorded
   decode steps (CUDA graphs, engine/graphs.py), and (without `--engine-only`) the same
   engine without them and transformers `generate` on the same weights;
2. each point against its floor: the bytes a decode step must read, the weights (all but the
   embedding table, of which it reads a row per sequence) plus the KV of every sequence at
   its mean context over the run (prompt + 32), over the device-to-device copy rate measured
   in the same run ((read + written bytes) / time of 1 GiB copies); the step as a multiple of
   it, the bandwidth it reached as % of the copy rate and as % of the device's spec sheet
   (profiling/analytic.py: H200 4.8 TB/s, H100 SXM 3.35 TB/s; none for other devices);
3. with overlapped steps (the default on CUDA), the share of each run the host spent waiting
   for the device: near 100% the device sets the pace; well below, the host does;
4. attention alone: the Triton paged decode kernel against the torch reference (page gather
   + SDPA) at 2k and 8k context, batch 16.

`--engine-only` skips the eager engine, transformers and the attention part (gpu_check.sh's
budget); `--json PATH` writes the numbers.

`--shape tiny --device cpu` runs the same script on a small model on CPU (eager recordings,
torch attention), to check the script itself.

    python scripts/bench_gpu.py [--device cuda] [--shape 8b] [--points 1x1024 64x2048]
        [--engine-only] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import torch

from bench_engine import OUT_LEN, ours, theirs  # scripts/ is on the path
from model_shapes import SHAPES, random_llama
from nitsum.config import ModelConfig
from nitsum.engine.engine_config import EngineConfig
from nitsum.engine.overlap import OverlapStepper
from nitsum.pool.local import ONLY_GROUP, local_engine
from nitsum.pool.pool_engine import PoolEngine
from nitsum.profiling.analytic import gpu_of_device
from nitsum_kernels.paged_attention import AttentionMetadata, paged_attention_ref

DEFAULT_POINTS = ("1x1024", "16x1024", "64x1024", "64x2048")


def parse_point(text: str) -> tuple[int, int]:
    """`BATCHxPROMPT` -> (batch, prompt tokens)."""
    batch, _, prompt = text.partition("x")
    if not (batch.isdigit() and prompt.isdigit() and int(batch) > 0 and int(prompt) > 0):
        raise argparse.ArgumentTypeError(f"expected BATCHxPROMPT (e.g. 64x2048), got {text!r}")
    return int(batch), int(prompt)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def copy_bandwidth(device: str, nbytes: int = 1 << 30, repeats: int = 10) -> float:
    """Device-to-device copy bandwidth, bytes/s, counting each copied byte twice (read and
    written): the memory bandwidth a weight-streaming decode step can use at best."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        dst.copy_(src)
    sync(device)
    return 2 * nbytes * repeats / (time.perf_counter() - t0)


def step_weight_bytes(tensors: list[tuple[str, torch.Tensor]], dtype: torch.dtype) -> int:
    """Bytes of the weights one decode step reads in `dtype`: every tensor but the embedding
    table (a tied table is the LM head, so it is read whole)."""
    names = {n for n, _ in tensors}
    tied = "lm_head.weight" not in names
    size = torch.tensor([], dtype=dtype).element_size()
    return sum(
        t.numel() * size for n, t in tensors if tied or not n.endswith("embed_tokens.weight")
    )


def kv_bytes_per_token(cfg: ModelConfig, dtype: torch.dtype) -> int:
    """Bytes of one token's K and V over every layer."""
    size = torch.tensor([], dtype=dtype).element_size()
    return cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * size


def decode_floor(
    batch: int, tok_s: float, weight_bytes: int, kv_bytes: int, copy_bps: float,
    spec_bps: float | None,
) -> dict:  # fmt: skip
    """One decode point against the bytes its step must read (weights + KV): its step, the
    floor (those bytes at the copy rate), the ratio, and the bandwidth reached as % of the
    copy rate and of the spec sheet (None without one)."""
    step_s = batch / tok_s
    moved = weight_bytes + kv_bytes
    reached = moved / step_s
    return {
        "step_ms": step_s * 1e3,
        "kv_bytes": kv_bytes,
        "floor_ms": moved / copy_bps * 1e3,
        "floor_ratio": step_s / (moved / copy_bps),
        "pct_copy": 100 * reached / copy_bps,
        "pct_spec": None if spec_bps is None else 100 * reached / spec_bps,
    }


def engine_config(device: str, dtype: torch.dtype, cfg: ModelConfig, points: list) -> EngineConfig:
    """Room for the largest point: its batch, its context, its KV (plus a tenth)."""
    longest = max(p for _, p in points) + OUT_LEN
    kv = max(b * (p + OUT_LEN + 16) for b, p in points) * kv_bytes_per_token(cfg, dtype)
    return EngineConfig(
        dtype=dtype, device=device, kv_cache_bytes=max(kv * 11 // 10, 256 << 20),
        max_batch=max(b for b, _ in points), max_context=longest,
        warm_kernels=device.startswith("cuda"),  # as the worker's: no compile in a timed step
    )  # fmt: skip


def attention_bench(device: str, dtype: torch.dtype, contexts: list[int]) -> None:
    from nitsum_kernels.paged_attention_triton import paged_attention_triton

    batch, hq, hkv, hd, page = 16, 32, 8, 128, 16
    for ctx in contexts:
        pages_per = ctx // page
        num_pages = batch * pages_per + 1
        kc = torch.randn(num_pages * page, hkv, hd, device=device, dtype=dtype)
        vc = torch.randn_like(kc)
        table = torch.randperm(num_pages - 1, device=device)[: batch * pages_per]
        meta = AttentionMetadata(
            slot_mapping=table.view(batch, pages_per)[:, -1] * page + page - 1,
            page_tokens=page,
            n_decode=batch,
            decode_pages=table.view(batch, pages_per),
            decode_lens=torch.full((batch,), ctx, device=device),
            decode_max_len=ctx,
            prefills=[],
        )
        q = torch.randn(batch, hq, hd, device=device, dtype=dtype)
        k = torch.randn(batch, hkv, hd, device=device, dtype=dtype)
        times = {}
        for name, fn in (("triton", paged_attention_triton), ("gather+sdpa", paged_attention_ref)):
            fn(q, k, k, kc, vc, meta, hd**-0.5)
            sync(device)
            t0 = time.perf_counter()
            for _ in range(20):
                fn(q, k, k, kc, vc, meta, hd**-0.5)
            sync(device)
            times[name] = (time.perf_counter() - t0) / 20
        print(
            f"[attention] batch {batch}, context {ctx}: triton {times['triton'] * 1e6:.0f} us, "
            f"gather+SDPA {times['gather+sdpa'] * 1e6:.0f} us "
            f"({times['gather+sdpa'] / times['triton']:.2f}x)"
        )


def run_point(engine: PoolEngine, prompts: list[list[int]]) -> tuple[float, float | None]:
    """Decode-only tok/s of `prompts` (fresh), and with overlapped steps the share of the run
    the host waited for the device (None without)."""
    stepper = engine.engines[ONLY_GROUP].driver
    waited, started = getattr(stepper, "waited_s", 0.0), time.perf_counter()
    rate = ours(engine, prompts)[1]
    if not isinstance(stepper, OverlapStepper):
        return rate, None
    # NOTE: below ~50% the host, not the device, sets the pace (docs/gpu.md).
    return rate, (stepper.waited_s - waited) / (time.perf_counter() - started)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="8b")
    ap.add_argument(
        "--points", type=parse_point, nargs="+", default=[parse_point(p) for p in DEFAULT_POINTS],
        help="BATCHxPROMPT decode points",
    )  # fmt: skip
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--engine-only", action="store_true", help="the engine with graphs alone")
    ap.add_argument("--json", type=Path, default=None, help="write the numbers here")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    hf, hf_cfg = random_llama(args.shape, args.device, dtype)
    cfg = ModelConfig.from_hf(hf_cfg.to_dict() | {"architectures": ["LlamaForCausalLM"]})
    ecfg = engine_config(args.device, dtype, cfg, args.points)
    tensors = list(hf.state_dict().items())
    graphs = local_engine(cfg, tensors, replace(ecfg, decode_graphs=True))
    eager = (
        None if args.engine_only else local_engine(cfg, tensors, replace(ecfg, decode_graphs=False))
    )
    if args.engine_only:
        del hf  # its memory goes to the engine's KV and recordings
    on_gpu = args.device.startswith("cuda")
    gpu = torch.cuda.get_device_name(torch.device(args.device)) if on_gpu else "cpu"
    spec = gpu_of_device(gpu) if on_gpu else None
    spec_bps = None if spec is None else spec.hbm_tbps * 1e12
    print(f"{args.shape} ({args.dtype}) on {gpu}, torch {torch.__version__}")
    weight_bytes = step_weight_bytes(tensors, dtype)
    del tensors
    kv_token = kv_bytes_per_token(cfg, dtype)
    bandwidth = copy_bandwidth(args.device)
    print(
        f"[floor] step weights {weight_bytes / 1e9:.2f} GB, KV {kv_token / 1024:.0f} KiB a "
        f"token, copy rate {bandwidth / 1e9:.0f} GB/s, spec "
        + ("-" if spec_bps is None else f"{spec_bps / 1e9:.0f} GB/s")
    )
    g = torch.Generator().manual_seed(1)
    if on_gpu:  # warm-up: a prompt of each length, so no kernel compiles in a timed run
        for prompt in sorted({p for _, p in args.points}):
            ours(graphs, [torch.randint(0, cfg.vocab_size, (prompt,), generator=g).tolist()])
    result: dict = {
        "shape": args.shape,
        "dtype": args.dtype,
        "device": args.device,
        "gpu": gpu,
        "weight_bytes": weight_bytes,
        "kv_bytes_per_token": kv_token,
        "copy_gbps": bandwidth / 1e9,
        "spec_gbps": None if spec_bps is None else spec_bps / 1e9,
        "new_tokens": OUT_LEN,
        "points": [],
    }
    for batch, prompt in args.points:
        prompts = [torch.randint(0, cfg.vocab_size, (prompt,), generator=g).tolist()
                   for _ in range(batch)]  # fmt: skip
        rate, waited = run_point(graphs, prompts)
        # NOTE: the KV a step reads at the run's mean context: the prompt + half the output.
        kv = batch * (prompt + OUT_LEN // 2) * kv_token
        point = {"batch": batch, "prompt": prompt, "tok_s": rate, "host_waited": waited}
        point |= decode_floor(batch, rate, weight_bytes, kv, bandwidth, spec_bps)
        result["points"].append(point)
        spec_pct = "-" if point["pct_spec"] is None else f"{point['pct_spec']:.0f}%"
        print(
            f"[decode] batch {batch:>3} x {prompt:>5}: {rate:8.1f} tok/s, step "
            f"{point['step_ms']:.2f} ms = {point['floor_ratio']:.2f}x the floor "
            f"{point['floor_ms']:.2f} ms ({(weight_bytes + kv) / 1e9:.2f} GB); "
            f"{point['pct_copy']:.0f}% of the copy rate, {spec_pct} of spec"
            + ("" if waited is None else f"; the host waited {waited:.0%} of the run")
        )
        if eager is None:
            continue
        rates = {"eager": ours(eager, prompts)[1], "transformers": theirs(hf, prompts)[1]}
        print(
            f"[decode] batch {batch:>3} x {prompt:>5}: without graphs {rates['eager']:8.1f} | "
            f"transformers {rates['transformers']:8.1f} tok/s | graphs/eager "
            f"{rate / rates['eager']:.2f}x, vs transformers {rate / rates['transformers']:.2f}x"
        )
    replays = graphs.pool.runner.graphs.replays
    result["replays"] = replays
    print(f"[decode] recorded steps replayed: {replays}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    if on_gpu and not args.engine_only:
        attention_bench(args.device, dtype, [2048, 8192])


if __name__ == "__main__":
    main()
