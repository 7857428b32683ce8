"""Engine throughput vs transformers `generate`, side by side in one run.

Same model (the embedded SmolLM2-135M-Instruct, CPU), same 128-token prompts, 64 output
tokens (EOS ignored), batch 1 / 16 / 64 concurrent requests. Every run gets prompts of its own
(a seed per run), so the engine's prefix cache never serves a repeat: both sides prefill every
prompt. Reported per batch, best of `--repeats` interleaved runs:

- end to end tok/s (prefill included, what `generate` returns) for both, and the ratio;
- decode-only tok/s: the engine's steps once every request has its first token; for
  transformers, generate(64) minus generate(1) on the same prompts;
- at batch 16, the matmul limit: the decode step's GEMMs alone (every linear layer and the LM
  head at M = 16 with this model's weights) with the engine's GEMM (oneDNN in fp32 on CPU:
  kernels/linear.py) and the fraction of it the engine's decode step reaches; and the same
  GEMMs through F.linear (MKL), which transformers runs;
- bf16 weights and KV: the engine at batch 1 against the fp32 engine (and transformers bf16).

    python scripts/bench_engine.py [--batches 1 16 64] [--repeats 2]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from nitsum.engine.request_spec import RequestSpec
from nitsum.llm import LLM
from nitsum.pool.pool_engine import PoolEngine
from nitsum.sampling import SamplingParams
from nitsum_kernels.linear import linear

PROMPT_LEN, OUT_LEN = 128, 64


def prompts(n: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(100, vocab - 100, (PROMPT_LEN,), generator=g).tolist() for _ in range(n)]


def ours(engine: PoolEngine, batch: list[list[int]]) -> tuple[float, float]:
    """(end-to-end tok/s, decode-only tok/s) of the engine on `batch`."""
    params = SamplingParams(max_tokens=OUT_LEN, temperature=0, ignore_eos=True)
    ids = [f"b{time.monotonic_ns()}-{i}" for i in range(len(batch))]
    for rid, prompt in zip(ids, batch, strict=True):
        engine.add_request(rid, prompt, RequestSpec(params))
    got = dict.fromkeys(ids, 0)
    t0 = time.perf_counter()
    decode_start, decode_tokens = 0.0, 0
    while engine.has_unfinished():
        all_started = all(got.values())
        t_step = time.perf_counter()
        outs = engine.step()
        for out in outs:
            got[out.request_id] += len(out.new_token_ids)
        if all_started:
            decode_start = decode_start or t_step
            decode_tokens += sum(len(o.new_token_ids) for o in outs)
    end = time.perf_counter()
    assert all(n == OUT_LEN for n in got.values()), got
    return len(batch) * OUT_LEN / (end - t0), decode_tokens / (end - decode_start)


def generate(hf: torch.nn.Module, ids: torch.Tensor, new: int) -> float:
    if ids.is_cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.no_grad():
        out = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            pad_token_id=0,
        )
    assert out.shape[1] == ids.shape[1] + new  # (its tokens are on the host: no sync needed)
    return time.perf_counter() - t0


def theirs(hf: torch.nn.Module, batch: list[list[int]]) -> tuple[float, float]:
    """(end-to-end tok/s, decode-only tok/s) of transformers on `batch`."""
    ids = torch.tensor(batch, device=next(hf.parameters()).device)
    first = generate(hf, ids, 1)
    whole = generate(hf, ids, OUT_LEN)
    return len(batch) * OUT_LEN / whole, len(batch) * (OUT_LEN - 1) / max(whole - first, 1e-9)


def matmul_limit(llm: LLM, m: int, repeats: int, gemm: Callable = linear) -> float:
    """Seconds of one decode step's GEMMs at M = `m` (every layer's linears, the LM head),
    by `gemm`: the engine's (`kernels.linear`: oneDNN in fp32 on CPU) or `F.linear`'s."""
    model = llm.engine.pool.runner.model  # type: ignore[attr-defined]
    w = model.weights
    # NOTE: o_proj and down_proj are stored (in, out) (their TP shards are row views).
    per_layer = [(x.qkv, x.o_t.t(), x.gate_up, x.down_t.t()) for x in w.layers]
    mats = [t for four in per_layer for t in four]
    mats.append(w.lm_head)
    xs = {t.shape[1]: torch.randn(m, t.shape[1], dtype=t.dtype) for t in mats}
    best = float("inf")
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        for t in mats:
            gemm(xs[t.shape[1]], t)
        best = min(best, time.perf_counter() - t0)
    return best


def best_of(runs: list[tuple[float, float]]) -> tuple[float, float]:
    return max(r[0] for r in runs), max(r[1] for r in runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--repeats", type=int, default=2, help="best of N interleaved runs per side")
    ap.add_argument("--no-bf16", action="store_true", help="skip the bf16 comparison")
    ap.add_argument("--smoke", action="store_true", help="16-token prompts, 8 tokens out (tests)")
    args = ap.parse_args()
    if args.smoke:
        global PROMPT_LEN, OUT_LEN  # noqa: PLW0603 (read by ours/theirs/prompts)
        PROMPT_LEN, OUT_LEN = 16, 8
    llm = LLM(None, kv_cache_mb=512)
    hf = AutoModelForCausalLM.from_pretrained(llm.model_dir, dtype=torch.float32).eval()
    vocab = llm.engine.cfg.vocab_size
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, SmolLM2-135M")
    targets = {1: 1.25, 16: 2.0}
    seed = 0
    for n in args.batches:
        a_runs, b_runs = [], []
        for _ in range(args.repeats):
            seed += 1
            batch = prompts(n, vocab, seed)
            a_runs.append(ours(llm.engine, batch))
            b_runs.append(theirs(hf, batch))
        (a, a_dec), (b, b_dec) = best_of(a_runs), best_of(b_runs)
        target = f" (target >= {targets[n]}x)" if n in targets else ""
        print(
            f"fp32 batch {n:>3}: e2e nitsum {a:7.1f} | transformers {b:7.1f} tok/s | "
            f"ratio {a / b:.2f}x{target}; decode-only {a_dec:7.1f} | {b_dec:7.1f} tok/s | "
            f"ratio {a_dec / b_dec:.2f}x"
        )
        if n == 16:
            limit = matmul_limit(llm, 16, args.repeats)
            mkl = matmul_limit(llm, 16, args.repeats, F.linear)
            step = 16 / a_dec
            print(
                f"  matmul limit at 16 (the engine's GEMM): {limit * 1e3:.1f} ms/step = "
                f"{16 / limit:.0f} tok/s; engine decode step {step * 1e3:.1f} ms: "
                f"{limit / step:.0%} of the limit. (F.linear's GEMM, which transformers "
                f"runs: {mkl * 1e3:.1f} ms/step)"
            )
    if args.no_bf16:
        return
    llm16 = LLM(None, kv_cache_mb=512, dtype="bfloat16")
    hf16 = AutoModelForCausalLM.from_pretrained(llm.model_dir, dtype=torch.bfloat16).eval()
    runs32, runs16, runs_hf16 = [], [], []
    for _ in range(args.repeats):
        seed += 1
        batch = prompts(1, vocab, seed)
        runs32.append(ours(llm.engine, batch))
        runs16.append(ours(llm16.engine, batch))
        runs_hf16.append(theirs(hf16, batch))
    (a32, _), (a16, _), (h16, _) = best_of(runs32), best_of(runs16), best_of(runs_hf16)
    print(
        f"bf16 batch   1: nitsum bf16 {a16:7.1f} | nitsum fp32 {a32:7.1f} tok/s | ratio "
        f"{a16 / a32:.2f}x (target >= 1.7x); transformers bf16 {h16:7.1f} ({a16 / h16:.2f}x)"
    )


if __name__ == "__main__":
    main()
