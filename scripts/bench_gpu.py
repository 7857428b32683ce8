"""The engine on a GPU, side by side in one run (for a session that is lent one).

A Llama-3-8B-shaped model with random weights (nothing is downloaded), bf16:
1. decode tok/s at batch 1 / 16 / 64 (128-token prompts, 64 new tokens, EOS ignored): the
   engine with recorded decode steps (CUDA graphs, engine/graphs.py), the same engine
   without them, and transformers `generate` on the same weights;
2. the weight-read floor of a decode step: the bytes of every weight a step reads (all but the
   embedding table, of which it reads a row per sequence) / the device-to-device copy
   bandwidth measured in the same run ((read + written bytes) / time of a 1 GiB copy), and the
   batch-1 step against it (target <= 1.3x);
3. with overlapped steps (the default on CUDA), the share of each run the host spent waiting
   for the device: near 100% the device sets the pace; well below, the host does;
4. attention alone: the Triton paged decode kernel against the torch reference (page gather
   + SDPA) at 2k and 8k context, batch 16.

`--engine-only` skips the eager engine, transformers and the attention part (gpu_check.sh's
budget); `--json PATH` writes the numbers.

`--shape tiny --device cpu` runs the same script on a small model on CPU (eager recordings,
torch attention), to check the script itself.

    python scripts/bench_gpu.py [--device cuda] [--shape 8b] [--batches 1 16 64] [--engine-only]
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import torch

from bench_engine import PROMPT_LEN, ours, theirs  # scripts/ is on the path
from model_shapes import SHAPES, random_llama
from nitsum.config import ModelConfig
from nitsum.engine.engine_config import EngineConfig
from nitsum.engine.overlap import OverlapStepper
from nitsum.kernels.paged_attention import AttentionMetadata, paged_attention_ref
from nitsum.pool.local import ONLY_GROUP, local_engine

PROMPT = PROMPT_LEN  # and 64 new tokens (bench_engine's)


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


def attention_bench(device: str, dtype: torch.dtype, contexts: list[int]) -> None:
    from nitsum.kernels.paged_attention_triton import paged_attention_triton

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="8b")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--engine-only", action="store_true", help="the engine with graphs alone")
    ap.add_argument("--json", type=Path, default=None, help="write the numbers here")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    hf, hf_cfg = random_llama(args.shape, args.device, dtype)
    cfg = ModelConfig.from_hf(hf_cfg.to_dict() | {"architectures": ["LlamaForCausalLM"]})
    ecfg = EngineConfig(
        dtype=dtype, device=args.device, kv_cache_bytes=8 << 30, max_batch=64, max_context=1024
    )
    if not args.device.startswith("cuda"):
        ecfg = replace(ecfg, kv_cache_bytes=256 << 20)
    tensors = list(hf.state_dict().items())
    graphs = local_engine(cfg, tensors, replace(ecfg, decode_graphs=True))
    eager = (
        None if args.engine_only else local_engine(cfg, tensors, replace(ecfg, decode_graphs=False))
    )
    if args.engine_only:
        del hf  # its memory goes to the engine's KV and recordings
    print(f"{args.shape} ({args.dtype}) on {args.device}, torch {torch.__version__}")
    weight_bytes = step_weight_bytes(tensors, dtype)
    del tensors
    bandwidth = copy_bandwidth(args.device)
    floor_s = weight_bytes / bandwidth
    print(
        f"[floor] step weights {weight_bytes / 1e9:.2f} GB, copy bandwidth "
        f"{bandwidth / 1e9:.0f} GB/s: weight-read floor {floor_s * 1e3:.2f} ms/step"
    )
    g = torch.Generator().manual_seed(1)
    if args.device.startswith("cuda"):  # warm-up: the prefill kernels compile on first use
        ours(graphs, [torch.randint(0, cfg.vocab_size, (PROMPT,), generator=g).tolist()])
    result: dict = {
        "shape": args.shape,
        "dtype": args.dtype,
        "device": args.device,
        "weight_bytes": weight_bytes,
        "copy_gbps": bandwidth / 1e9,
        "floor_ms": floor_s * 1e3,
        "decode_tok_s": {},
    }
    for b in args.batches:
        prompts = [
            torch.randint(0, cfg.vocab_size, (PROMPT,), generator=g).tolist() for _ in range(b)
        ]
        stepper = graphs.engines[ONLY_GROUP].driver
        waited, started = getattr(stepper, "waited_s", 0.0), time.perf_counter()
        rates = {"graphs": ours(graphs, prompts)[1]}
        result["decode_tok_s"][str(b)] = rates["graphs"]
        if isinstance(stepper, OverlapStepper):
            # NOTE: below ~50% the host, not the device, sets the pace (docs/gpu.md).
            share = (stepper.waited_s - waited) / (time.perf_counter() - started)
            result.setdefault("device_wait_share", {})[str(b)] = share
            print(f"[host] batch {b:>3}: the host waited for the device {share:.0%} of the run")
        if b == 1:
            step_s = 1 / rates["graphs"]
            result["step_ms_b1"] = step_s * 1e3
            result["floor_ratio_b1"] = step_s / floor_s
            print(
                f"[floor] batch 1 step {step_s * 1e3:.2f} ms = {step_s / floor_s:.2f}x the "
                "weight-read floor (target <= 1.3x)"
            )
        if eager is None:
            print(f"[decode] batch {b:>3}: nitsum with graphs {rates['graphs']:8.1f} tok/s")
            continue
        rates["eager"] = ours(eager, prompts)[1]
        rates["transformers"] = theirs(hf, prompts)[1]
        print(
            f"[decode] batch {b:>3}: nitsum with graphs {rates['graphs']:8.1f} tok/s | without "
            f"{rates['eager']:8.1f} | transformers {rates['transformers']:8.1f} | graphs/eager "
            f"{rates['graphs'] / rates['eager']:.2f}x, vs transformers "
            f"{rates['graphs'] / rates['transformers']:.2f}x"
        )
    replays = graphs.pool.runner.graphs.replays
    result["replays"] = replays
    print(f"[decode] recorded steps replayed: {replays}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    if args.device.startswith("cuda") and not args.engine_only:
        attention_bench(args.device, dtype, [2048, 8192])


if __name__ == "__main__":
    main()
