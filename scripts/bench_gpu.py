"""The engine on a GPU, side by side in one run (for a session that is lent one).

A Llama-3-8B-shaped model with random weights (nothing is downloaded), bf16:
1. decode tok/s at batch 1 / 16 / 64 (128-token prompts, 64 new tokens, EOS ignored): the
   engine with recorded decode steps (CUDA graphs, engine/graphs.py), the same engine
   without them, and transformers `generate` on the same weights;
2. attention alone: the Triton paged decode kernel against the torch reference (page gather
   + SDPA) at 2k and 8k context, batch 16.

`--shape tiny --device cpu` runs the same script on a small model on CPU (eager recordings,
torch attention), to check the script itself.

    python scripts/bench_gpu.py [--device cuda] [--shape 8b] [--batches 1 16 64]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from bench_engine import PROMPT_LEN, ours, theirs  # scripts/ is on the path
from nitsum.config import ModelConfig
from nitsum.engine.engine_config import EngineConfig
from nitsum.kernels.paged_attention import AttentionMetadata, paged_attention_ref
from nitsum.pool.local import local_engine

SHAPES = {
    "8b": dict(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
        max_position_embeddings=8192,
        rope_theta=500000.0,
    ),
    "tiny": dict(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        vocab_size=1024,
        max_position_embeddings=2048,
    ),
}
PROMPT = PROMPT_LEN  # and 64 new tokens (bench_engine's)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


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
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    hf_cfg = LlamaConfig(**SHAPES[args.shape])
    with torch.device(args.device):
        hf = LlamaForCausalLM(hf_cfg).to(dtype).eval()
    cfg = ModelConfig.from_hf(hf_cfg.to_dict() | {"architectures": ["LlamaForCausalLM"]})
    ecfg = EngineConfig(
        dtype=dtype, device=args.device, kv_cache_bytes=8 << 30, max_batch=64, max_context=1024
    )
    if not args.device.startswith("cuda"):
        ecfg = replace(ecfg, kv_cache_bytes=256 << 20)
    tensors = list(hf.state_dict().items())
    graphs = local_engine(cfg, tensors, replace(ecfg, decode_graphs=True))
    eager = local_engine(cfg, tensors, replace(ecfg, decode_graphs=False))
    print(f"{args.shape} ({args.dtype}) on {args.device}, torch {torch.__version__}")
    g = torch.Generator().manual_seed(1)
    for b in args.batches:
        prompts = [
            torch.randint(0, cfg.vocab_size, (PROMPT,), generator=g).tolist() for _ in range(b)
        ]
        rates = {
            "graphs": ours(graphs, prompts)[1],
            "eager": ours(eager, prompts)[1],
            "transformers": theirs(hf, prompts)[1],
        }
        print(
            f"[decode] batch {b:>3}: nitsum with graphs {rates['graphs']:8.1f} tok/s | without "
            f"{rates['eager']:8.1f} | transformers {rates['transformers']:8.1f} | graphs/eager "
            f"{rates['graphs'] / rates['eager']:.2f}x, vs transformers "
            f"{rates['graphs'] / rates['transformers']:.2f}x"
        )
    replays = graphs.pool.runner.graphs.replays
    print(f"[decode] recorded steps replayed: {replays}")
    if args.device.startswith("cuda"):
        attention_bench(args.device, dtype, [2048, 8192])


if __name__ == "__main__":
    main()
