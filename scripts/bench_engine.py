"""Engine decode throughput vs transformers `generate`, side by side in one run.

Same model (the embedded SmolLM2-135M-Instruct, fp32, CPU), same 128-token prompts,
64 output tokens (EOS ignored), batch 1 and 16 concurrent requests.

    python scripts/bench_engine.py [--batches 1 16] [--repeats 2]
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import AutoModelForCausalLM

from nitsum.llm import LLM
from nitsum.sampling import SamplingParams

PROMPT_LEN, OUT_LEN = 128, 64


def prompts(n: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(100, vocab - 100, (PROMPT_LEN,), generator=g).tolist() for _ in range(n)]


def ours(llm: LLM, batch: list[list[int]]) -> float:
    params = SamplingParams(max_tokens=OUT_LEN, temperature=0, ignore_eos=True)
    t0 = time.perf_counter()
    outs = llm.generate(batch, params)
    dt = time.perf_counter() - t0
    assert all(len(o.token_ids) == OUT_LEN for o in outs)
    return len(batch) * OUT_LEN / dt


def theirs(hf: torch.nn.Module, batch: list[list[int]]) -> float:
    ids = torch.tensor(batch)
    t0 = time.perf_counter()
    with torch.no_grad():
        out = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=OUT_LEN,
            min_new_tokens=OUT_LEN,
            do_sample=False,
            pad_token_id=0,
        )
    dt = time.perf_counter() - t0
    assert out.shape[1] == PROMPT_LEN + OUT_LEN
    return len(batch) * OUT_LEN / dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--repeats", type=int, default=2, help="best of N for each side")
    args = ap.parse_args()
    llm = LLM(None, kv_cache_mb=256)
    hf = AutoModelForCausalLM.from_pretrained(llm.model_dir, dtype=torch.float32).eval()
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, SmolLM2-135M fp32")
    targets = {1: 2.0, 16: 4.0}
    for n in args.batches:
        batch = prompts(n, llm.engine.cfg.vocab_size)
        a = max(ours(llm, batch) for _ in range(args.repeats))
        b = max(theirs(hf, batch) for _ in range(args.repeats))
        target = f" (target >= {targets[n]:.0f}x)" if n in targets else ""
        print(
            f"batch {n:>3}: nitsum {a:7.1f} tok/s | transformers {b:7.1f} tok/s | "
            f"ratio {a / b:.2f}x{target}"
        )


if __name__ == "__main__":
    main()
