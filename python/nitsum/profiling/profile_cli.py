"""`nitsum profile`: measure a profile on local devices, or write an analytic one.

`--device cpu` (default) measures every TP level over a pool of CPU device processes;
`--device cuda` measures Nitsum's engine on one GPU at TP 1 (profiling/engine_profile.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from nitsum.engine.engine_config import EngineConfig
from nitsum.parallel.topology import GroupShape


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="nitsum profile", description=__doc__)
    ap.add_argument("--model", default=None, help="model name, HF dir or GGUF (default: embedded)")
    ap.add_argument(
        "--devices", type=int, default=None, help="CPU devices (default: largest level)"
    )
    ap.add_argument("--device-kind", default=None, help="name in the file (default: cpu-<N>core)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="fewer points (smoke runs)")
    ap.add_argument(
        "--out", default=None, help="output JSON (default: profiles/<device>-<model>.json)"
    )
    ap.add_argument("--analytic", action="store_true", help="roofline profile for a GPU we lack")
    ap.add_argument(
        "--device", default="cpu", help="cpu (a pool of CPU devices), or cuda[:i] (TP 1 on it)"
    )
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, the CPU default")
    ap.add_argument("--kv-cache-mb", type=int, default=30000, help="KV pool on cuda, MiB")
    ap.add_argument(
        "--one-device",
        action="store_true",
        help="TP 1 of the engine in this process even on cpu (the --device cuda path; checks)",
    )
    args, rest = ap.parse_known_args(argv)
    if args.analytic:
        from nitsum.profiling.analytic import main as analytic_main

        return analytic_main(rest + (["--out", args.out] if args.out else []))
    if rest:
        ap.error(f"unrecognized arguments: {' '.join(rest)}")

    from nitsum.engine.load import load_config, resolve_model_dir
    from nitsum.pool.device_pool import DevicePool
    from nitsum.pool.device_proc import ModelSource
    from nitsum.pool.pool_engine import PoolEngine
    from nitsum.profiling.measure import measure_profile

    model_dir = resolve_model_dir(args.model)
    if args.device != "cpu" or args.one_device:
        return _profile_one_device(args, model_dir)
    cfg = load_config(model_dir)
    ecfg = EngineConfig()
    levels = cfg.allowed_tp_levels(ecfg.tp_levels)
    devices = args.devices or max(levels)
    num_pages = 2048
    kind = args.device_kind or f"cpu-{os.cpu_count()}core"
    with DevicePool(devices, ModelSource(model_dir=str(model_dir)), ecfg, num_pages) as pool:
        pe = PoolEngine(
            pool, cfg, ecfg, num_pages, [GroupShape.tp_group((d,)) for d in range(devices)]
        )
        kw = {}
        if args.quick:
            kw = {"prefill_tokens": (16, 128), "batches": (1, 8), "contexts": (128,)}
        profile = measure_profile(pe, cfg, model_dir.name, kind, args.repeats, **kw)
    out = Path(args.out or f"profiles/{kind}-{model_dir.name}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(profile, indent=1) + "\n")
    print(out, file=sys.stderr)
    return 0


def _profile_one_device(args: argparse.Namespace, model_dir: Path) -> int:
    """TP 1 of this engine on one accelerator (`--device cuda`)."""
    import torch

    from nitsum.engine.load import load_model
    from nitsum.profiling import engine_profile as ep

    cfg, tensors = load_model(model_dir)
    grid = {
        "prefill_tokens": ep.GPU_PREFILL_TOKENS,
        "batches": ep.GPU_DECODE_BATCHES,
        "contexts": ep.GPU_DECODE_CONTEXTS,
    }
    if args.quick:
        grid = dict(ep.QUICK_GRID)
    longest = min(max(*grid["prefill_tokens"], *grid["contexts"]), cfg.max_position_embeddings)
    on_gpu = args.device.startswith("cuda")
    dtype = getattr(torch, args.dtype or ("bfloat16" if on_gpu else "float32"))
    ecfg = ep.profile_engine_config(args.device, dtype, args.kv_cache_mb << 20, longest)
    kind = args.device_kind or (
        torch.cuda.get_device_name(torch.device(args.device)) if on_gpu else args.device
    )
    kind = kind.lower().replace(" ", "-")
    profile = ep.measure_engine_profile(
        cfg, tensors, model_dir.name, kind, ecfg, args.repeats, **grid
    )
    out = Path(args.out or f"profiles/{kind}-{model_dir.name}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(profile, indent=1) + "\n")
    print(out, file=sys.stderr)
    return 0
