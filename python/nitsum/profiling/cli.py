"""`nitsum profile`: measure a profile on local devices, or write an analytic one."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from nitsum.engine.engine_config import EngineConfig


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
    cfg = load_config(model_dir)
    ecfg = EngineConfig()
    levels = cfg.allowed_tp_levels(ecfg.tp_levels)
    devices = args.devices or max(levels)
    num_pages = 2048
    kind = args.device_kind or f"cpu-{os.cpu_count()}core"
    with DevicePool(devices, ModelSource(model_dir=str(model_dir)), ecfg, num_pages) as pool:
        pe = PoolEngine(pool, cfg, ecfg, num_pages, [(d,) for d in range(devices)])
        kw = {}
        if args.quick:
            kw = {"prefill_tokens": (16, 128), "batches": (1, 8), "contexts": (128,)}
        profile = measure_profile(pe, cfg, model_dir.name, kind, args.repeats, **kw)
    out = Path(args.out or f"profiles/{kind}-{model_dir.name}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(profile, indent=1) + "\n")
    print(out, file=sys.stderr)
    return 0
