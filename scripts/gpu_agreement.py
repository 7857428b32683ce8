"""The engine's greedy tokens against transformers' on one device (gpu_check.sh's agreement row).

1. Tiny variants (tests/tiny.py: GQA, Qwen2 biases, Llama-3 RoPE, tied embeddings), fp32,
   five prompts of 3..150 tokens, 24 greedy tokens each, recorded decode steps on and off:
   the engine's ids must equal transformers' `generate` ids exactly.
2. A Llama-3-8B-shaped model cut to 4 layers (random weights), the engine in bf16 against
   transformers in fp32 on the same weights: the engine's first token of each prompt must be
   transformers' fp32 argmax, or within `FIRST_TOKEN_TOL` logits of it (bf16 rounding can
   swap two near-tied candidates of a random model, whose logits are close together; the gap
   is reported). The greedy ids' agreement over 8 tokens is reported, not judged (bf16 and
   fp32 continuations may part after a near tie).

On CPU (`--device cpu`) part 2 runs a tiny shape instead (1 layer, hidden 256): it proves the
script, not the numbers. Writes a JSON summary with `--json PATH`; exit code 1 on any failure.

    python scripts/gpu_agreement.py --device cuda --json agreement.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from nitsum.config import ModelConfig  # noqa: E402
from nitsum.engine.engine_config import EngineConfig  # noqa: E402
from nitsum.engine.request_spec import RequestSpec  # noqa: E402
from nitsum.pool.local import local_engine  # noqa: E402
from nitsum.pool.pool_engine import PoolEngine  # noqa: E402
from nitsum.sampling import SamplingParams  # noqa: E402
from tiny import make_tiny, random_prompt  # noqa: E402

VARIANTS = ("llama-gqa", "qwen2-bias", "llama3-rope", "llama-tied")
TINY_LENS = (3, 17, 40, 90, 150)
TINY_TOKENS = 24
BIG_LENS = (7, 300, 1500)
BIG_TOKENS = 8
FIRST_TOKEN_TOL = 0.05  # fp32 logit gap within which a bf16 first token still agrees
BIG_SHAPE = dict(
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=4,
    num_attention_heads=32,
    num_key_value_heads=8,
    vocab_size=128256,
    max_position_embeddings=8192,
    rope_theta=500000.0,
)
CPU_SHAPE = BIG_SHAPE | dict(
    hidden_size=256, intermediate_size=896, num_hidden_layers=1, vocab_size=4096
)


def hf_greedy(hf: torch.nn.Module, ids: list[int], n: int, device: str) -> list[int]:
    """Transformers' greedy continuation of `ids` (EOS ignored)."""
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([ids], device=device),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=device),
            max_new_tokens=n,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(ids) :].tolist()


def engine_greedy(engine: PoolEngine, prompts: list[list[int]], n: int) -> list[list[int]]:
    """The engine's greedy ids for every prompt, all batched together."""
    params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
    for i, ids in enumerate(prompts):
        engine.add_request(f"r{i}", ids, RequestSpec(params))
    got: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for o in engine.step():
            got.setdefault(o.request_id, []).extend(o.new_token_ids)
    return [got[f"r{i}"] for i in range(len(prompts))]


def tiny_cases(device: str) -> list[dict]:
    """Part 1: exact greedy agreement per variant, recorded steps on and off."""
    cases = []
    for variant in VARIANTS:
        hf, cfg = make_tiny(variant)
        hf = hf.to(device)
        prompts = [random_prompt(cfg, n, seed=i) for i, n in enumerate(TINY_LENS)]
        ref = [hf_greedy(hf, p, TINY_TOKENS, device) for p in prompts]
        tensors = [(k, v.detach()) for k, v in hf.state_dict().items()]
        for graphs in (True, False):
            case = {"case": f"{variant} graphs={graphs}"}
            ecfg = EngineConfig(
                device=device,
                page_tokens=16,
                token_budget=64,
                kv_cache_bytes=64 << 20,
                max_context=256,
                decode_graphs=graphs,
            )
            try:
                out = engine_greedy(local_engine(cfg, tensors, ecfg), prompts, TINY_TOKENS)
                case["ok"] = out == ref
                case["mismatched_prompts"] = [i for i in range(len(ref)) if out[i] != ref[i]]
            except Exception as e:  # noqa: BLE001 - report and go on to the next case
                case["ok"], case["error"] = False, f"{type(e).__name__}: {e}"
            cases.append(case)
    return cases


def big_cases(device: str) -> list[dict]:
    """Part 2: the bf16 engine's first tokens against the fp32 transformers argmax."""
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = BIG_SHAPE if device.startswith("cuda") else CPU_SHAPE
    torch.manual_seed(0)
    hc = LlamaConfig(**shape)
    with torch.device(device):
        hf = LlamaForCausalLM(hc).float().eval()
    cfg = ModelConfig.from_hf(hc.to_dict() | {"architectures": ["LlamaForCausalLM"]})
    prompts = [random_prompt(cfg, n, seed=10 + i) for i, n in enumerate(BIG_LENS)]
    with torch.no_grad():
        last = [hf(torch.tensor([p], device=device)).logits[0, -1].float() for p in prompts]
    ref = [hf_greedy(hf, p, BIG_TOKENS, device) for p in prompts]
    tensors = [(k, v.detach().to(torch.bfloat16)) for k, v in hf.state_dict().items()]
    cases = []
    for graphs in (True, False):
        case: dict = {"case": f"8b-shape-{shape['num_hidden_layers']}L bf16 graphs={graphs}"}
        ecfg = EngineConfig(
            device=device,
            dtype=torch.bfloat16,
            kv_cache_bytes=(2 << 30) if device.startswith("cuda") else (256 << 20),
            max_context=2048,
            decode_graphs=graphs,
        )
        t0 = time.perf_counter()
        try:
            out = engine_greedy(local_engine(cfg, tensors, ecfg), prompts, BIG_TOKENS)
            gaps = [(lg.max() - lg[o[0]]).item() for lg, o in zip(last, out, strict=True)]
            case["first_exact"] = sum(o[0] == r[0] for o, r in zip(out, ref, strict=True))
            case["first_gap_max"] = round(max(gaps), 4)
            case["greedy_agree"] = sum(
                a == b for o, r in zip(out, ref, strict=True) for a, b in zip(o, r, strict=True)
            )
            case["greedy_total"] = BIG_TOKENS * len(prompts)
            case["ok"] = all(g <= FIRST_TOKEN_TOL for g in gaps)
        except Exception as e:  # noqa: BLE001
            case["ok"], case["error"] = False, f"{type(e).__name__}: {e}"
        case["s"] = round(time.perf_counter() - t0, 1)
        cases.append(case)
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return cases


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json", type=Path, default=None, help="write the summary here")
    args = ap.parse_args()
    cases = tiny_cases(args.device) + big_cases(args.device)
    for c in cases:
        extra = {k: v for k, v in c.items() if k not in ("case", "ok")}
        print(f"{'PASS' if c['ok'] else 'FAIL'} {c['case']} {extra}", flush=True)
    fails = sum(not c["ok"] for c in cases)
    summary = {"device": args.device, "cases": cases, "passed": len(cases) - fails, "failed": fails}
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))
    print(f"gpu_agreement: {len(cases) - fails}/{len(cases)} cases pass")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
