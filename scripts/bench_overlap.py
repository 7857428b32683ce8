"""Overlapped steps (engine/overlap.py) against synchronous ones, side by side in one run.

A random-weight Llama (nothing is downloaded) on one device, the one-device pool engine
with recorded decode steps: per batch size, the mean wall time of a decode step and decode
tok/s with the host's step preparation overlapped with the device and without, and whether
both gave the same greedy tokens.

`--shape tiny --device cpu` checks the script itself (on the CPU nothing overlaps).

    python scripts/bench_overlap.py [--device cuda] [--shape 8b] [--batches 1 16 64]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import torch

from model_shapes import SHAPES, random_llama  # scripts/ is on the path
from nitsum.config import ModelConfig
from nitsum.engine.engine_config import EngineConfig
from nitsum.engine.request_spec import RequestSpec
from nitsum.pool.local import local_engine
from nitsum.pool.pool_engine import PoolEngine
from nitsum.sampling import SamplingParams

PROMPT, NEW = 128, 64


def decode(engine: PoolEngine, prompts: list[list[int]]) -> tuple[float, dict[str, list[int]]]:
    """(mean seconds per step once every request has its first token, tokens by request)."""
    params = SamplingParams(max_tokens=NEW, temperature=0, ignore_eos=True)
    tag = time.monotonic_ns()
    for i, prompt in enumerate(prompts):
        engine.add_request(f"{tag}-{i}", prompt, RequestSpec(params))
    got: dict[str, list[int]] = {}
    started, steps = 0.0, 0
    while engine.has_unfinished():
        if len(got) == len(prompts) and not started:
            started = time.perf_counter()
        for out in engine.step():
            got.setdefault(out.request_id, []).extend(out.new_token_ids)
        steps += bool(started)
    seconds = (time.perf_counter() - started) / max(steps, 1)
    return seconds, {rid.split("-", 1)[1]: ids for rid, ids in got.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="8b")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    hf, hf_cfg = random_llama(args.shape, args.device, dtype)
    cfg = ModelConfig.from_hf(hf_cfg.to_dict() | {"architectures": ["LlamaForCausalLM"]})
    cuda = args.device.startswith("cuda")
    ecfg = EngineConfig(
        dtype=dtype,
        device=args.device,
        kv_cache_bytes=(8 << 30) if cuda else (256 << 20),
        max_batch=64,
        max_context=1024,
        decode_graphs=True,
    )
    tensors = list(hf.state_dict().items())
    del hf
    engines = {
        "overlapped": local_engine(cfg, tensors, replace(ecfg, overlap=True)),
        "synchronous": local_engine(cfg, tensors, replace(ecfg, overlap=False)),
    }
    print(f"{args.shape} ({args.dtype}) on {args.device}, torch {torch.__version__}")
    g = torch.Generator().manual_seed(1)
    for b in args.batches:
        prompts = [
            torch.randint(0, cfg.vocab_size, (PROMPT,), generator=g).tolist() for _ in range(b)
        ]
        decode(engines["synchronous"], prompts[:1])  # warm-up (Triton, allocators)
        decode(engines["overlapped"], prompts[:1])
        step_s, tokens = {}, {}
        for name, engine in engines.items():
            step_s[name], tokens[name] = decode(engine, prompts)
        same = tokens["overlapped"] == tokens["synchronous"]
        print(
            f"[decode] batch {b:>3}: step {step_s['synchronous'] * 1e3:7.3f} ms synchronous, "
            f"{step_s['overlapped'] * 1e3:7.3f} ms overlapped "
            f"({step_s['synchronous'] / step_s['overlapped']:.3f}x; "
            f"{b / step_s['overlapped']:8.1f} tok/s); same tokens: {same}"
        )


if __name__ == "__main__":
    main()
