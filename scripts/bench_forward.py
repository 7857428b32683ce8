"""One forward step on a GPU under each way of running it (for a session that is lent one).

A Llama-3-8B-shaped model (random weights, bf16, `--layers` of its 32 layers: the numbers
per layer extrapolate) on one set of weights, timed with CUDA events (median of
`--repeats`), for
1. a pure decode step of `--batch` rows at `--context` tokens of context, and
2. a mixed step: one prefill chunk of `--chunk` tokens plus `--batch` decode rows,
run as: the unfused torch elementwise path (eager), the fused Triton path (eager), the fused
path with whole-forward decode graphs (decode only) and with piecewise graphs
(engine/piecewise.py). Each prints its logits' largest difference to the torch path's.

`--device cpu --shape tiny` checks the script itself (set TRITON_INTERPRET=1 there).

    python scripts/bench_forward.py --layers 8 --batch 8 --chunk 256 --context 1024
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from nitsum.config import ModelConfig, mlp_blocks
from nitsum.engine.graphs import DecodeGraphs
from nitsum.engine.piecewise import PiecewiseGraphs, token_buckets
from nitsum.engine.request_spec import RequestSpec
from nitsum.engine.runner import ModelRunner
from nitsum.engine.scheduled import Scheduled
from nitsum.engine.sequence import Sequence
from nitsum.engine.step_inputs import StepInputs, build_step_inputs
from nitsum.kv.cache import KVCache
from nitsum.models.llama import LlamaModel
from nitsum.parallel.context import build_context
from nitsum.sampling import SamplingParams
from nitsum.weights.layout import build_weights

SHAPES = {
    "8b": dict(hidden=4096, inter=14336, heads=32, kv_heads=8, vocab=128256),
    "tiny": dict(hidden=128, inter=256, heads=8, kv_heads=2, vocab=512),
}


def config(shape: str, layers: int) -> ModelConfig:
    s = SHAPES[shape]
    return ModelConfig.from_hf(
        dict(
            architectures=["LlamaForCausalLM"],
            vocab_size=s["vocab"],
            hidden_size=s["hidden"],
            intermediate_size=s["inter"],
            num_hidden_layers=layers,
            num_attention_heads=s["heads"],
            num_key_value_heads=s["kv_heads"],
            max_position_embeddings=8192,
            rope_theta=500000.0,
        )
    )


def random_tensors(cfg: ModelConfig, device: str) -> dict[str, torch.Tensor]:
    """HF-named random weights (small values: a finite forward)."""
    h, i, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q, kv = cfg.num_heads * hd, cfg.num_kv_heads * hd

    def w(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=device) * 0.02

    out = {
        "model.embed_tokens.weight": w(cfg.vocab_size, h),
        "lm_head.weight": w(cfg.vocab_size, h),
    }
    out["model.norm.weight"] = torch.ones(h, device=device)
    for n in range(cfg.num_layers):
        p = f"model.layers.{n}."
        out |= {
            p + "input_layernorm.weight": torch.ones(h, device=device),
            p + "post_attention_layernorm.weight": torch.ones(h, device=device),
            p + "self_attn.q_proj.weight": w(q, h),
            p + "self_attn.k_proj.weight": w(kv, h),
            p + "self_attn.v_proj.weight": w(kv, h),
            p + "self_attn.o_proj.weight": w(h, q),
            p + "mlp.gate_proj.weight": w(i, h),
            p + "mlp.up_proj.weight": w(i, h),
            p + "mlp.down_proj.weight": w(h, i),
        }
    return out


def step(cfg: ModelConfig, batch: int, context: int, chunk: int, page_tokens: int) -> StepInputs:
    """`batch` decode rows at `context` tokens (then a `chunk`-token prefill, when > 0), each
    sequence on its own run of pages."""
    g = torch.Generator().manual_seed(0)
    items, first = [], 0
    for n, (start, q_len) in enumerate([(context - 1, 1)] * batch + [(0, chunk)] * (chunk > 0)):
        total = start + q_len
        seq = Sequence(
            f"s{n}",
            torch.randint(0, cfg.vocab_size, (total,), generator=g).tolist(),
            RequestSpec(SamplingParams()),
        )
        pages = -(-total // page_tokens)
        seq.pages = list(range(first, first + pages))
        first += pages
        items.append(Scheduled(seq, start, q_len))
    return build_step_inputs(items, page_tokens)


def timed(fn: Callable[[], torch.Tensor], device: str, repeats: int) -> tuple[float, torch.Tensor]:
    """Median milliseconds of `fn` (after 3 warm-up calls) and its last output."""
    for _ in range(3):
        out = fn()
    times = []
    for _ in range(repeats):
        if device.startswith("cuda"):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            out = fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            out = fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shape", default="8b", choices=sorted(SHAPES))
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    dev, dtype, page_tokens = args.device, torch.bfloat16, 16
    cfg = config(args.shape, args.layers)
    weights = build_weights(
        cfg, random_tensors(cfg, dev).items(), mlp_blocks(cfg, (1,)), dtype, dev
    )
    pages = 2 * (args.batch + 1) * -(-(args.context + args.chunk) // page_tokens)
    pool = KVCache(cfg, pages, page_tokens, dtype, dev, scratch_page=True)
    fused, unfused = LlamaModel(cfg, weights, fused=True), LlamaModel(cfg, weights, fused=False)
    ctx = build_context(cfg, weights, 1, 0)
    t0 = time.perf_counter()
    decode_graphs = DecodeGraphs(fused, ctx, pool, args.context + page_tokens)
    t1 = time.perf_counter()
    buckets = token_buckets(args.batch + args.chunk)
    piecewise = PiecewiseGraphs(fused, ctx, pool, buckets)
    t2 = time.perf_counter()
    print(
        f"{cfg.num_layers} layers; capture: decode graphs {t1 - t0:.1f}s "
        f"({len(decode_graphs.buckets)}), piecewise {t2 - t1:.1f}s ({len(buckets)} buckets)"
    )
    runners = {
        "torch eager": ModelRunner(unfused, pool, ctx),
        "fused eager": ModelRunner(fused, pool, ctx),
        "fused + decode graphs": ModelRunner(fused, pool, ctx, graphs=decode_graphs),
        "fused + piecewise": ModelRunner(fused, pool, ctx, piecewise=piecewise),
    }
    for name, chunk in (("decode", 0), ("mixed", args.chunk)):
        inputs = step(cfg, args.batch, args.context, chunk, page_tokens)
        print(
            f"{name}: {inputs.input_ids.shape[0]} tokens ({args.batch} decode rows at "
            f"{args.context}, prefill chunk {chunk})"
        )
        base = None
        for label, runner in runners.items():
            if label == "fused + decode graphs" and chunk:
                continue  # a prefill chunk never fits a decode recording
            with torch.inference_mode():
                ms, logits = timed(lambda r=runner, i=inputs: r.forward(i), dev, args.repeats)
            base = logits if base is None else base
            diff = (logits - base).abs().max().item()
            per_layer = ms / cfg.num_layers
            print(
                f"  {label:24s} {ms:8.3f} ms  ({per_layer:.3f} ms/layer)  max|Δlogits| {diff:.3g}"
            )


if __name__ == "__main__":
    main()
