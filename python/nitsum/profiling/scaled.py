"""A measured TP-1 profile extended to TP > 1 with the analytic model (profiling/analytic.py):
each point's measured time scaled as the analytic estimate scales, plus the analytic
collective cost. Marked `"analytic": true`, with the method and the ratios in the file.

Per point `x` (prefill tokens, or decode batch and context) and TP level `t`:

    ms(x, t) = measured(x, 1) / analytic(x, 1) · compute(x, t) + allreduce(x, t)

where `compute` is the analytic estimate without its collectives and `allreduce` the
analytic all-reduce cost (2 per layer, ring over NVLink). At `t = 1` this is the measured
point. NOTE: assumes the analytic model's error at TP `t` equals its error at TP 1 at the
same point (a per-step cost that does not shrink with TP makes TP > 1 look too fast), and
no collective was measured; a multi-GPU measurement should replace it.

`python -m nitsum.profiling.scaled MEASURED.json --gpu h200 --model llama3-8b-shape-v49k
--tp 1 2 4 8 --out SCALED.json`
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

from nitsum.profiling.analytic import GPUS, MODELS, Gpu, Model, _allreduce_ms, decode_ms, prefill_ms


def _compute_prefill(gpu: Gpu, model: Model, tp: int, n: int) -> float:
    return prefill_ms(gpu, model, tp, n) - _allreduce_ms(gpu, model, tp, n)


def _compute_decode(gpu: Gpu, model: Model, tp: int, b: int, c: int) -> float:
    return decode_ms(gpu, model, tp, b, c) - _allreduce_ms(gpu, model, tp, b)


def scale(measured: dict[str, Any], gpu: Gpu, model: Model, tp_levels: list[int]) -> dict:
    """`measured` (a TP-1 `nitsum-profile/1`) with prefill and decode points at `tp_levels`
    (the TP-1 grid at every level); the other fields as measured, plus `method` and
    `scaling` (the per-point TP-1 ratios)."""
    one_prefill = measured["prefill"]["1"]
    one_decode = measured["decode"]["1"]
    out = copy.deepcopy(measured)
    r = lambda x: round(x, 4)  # noqa: E731
    prefill_ratio = {
        p["tokens"]: p["ms"] / prefill_ms(gpu, model, 1, p["tokens"]) for p in one_prefill
    }
    decode_ratio = {
        (p["batch"], p["context"]): p["ms"] / decode_ms(gpu, model, 1, p["batch"], p["context"])
        for p in one_decode
    }
    out["prefill"] = {
        str(t): [
            {
                "tokens": n,
                "ms": r(
                    ratio * _compute_prefill(gpu, model, t, n) + _allreduce_ms(gpu, model, t, n)
                ),
            }
            for n, ratio in prefill_ratio.items()
        ]
        for t in tp_levels
    }
    out["decode"] = {
        str(t): [
            {
                "batch": b,
                "context": c,
                "ms": r(
                    ratio * _compute_decode(gpu, model, t, b, c) + _allreduce_ms(gpu, model, t, b)
                ),
            }
            for (b, c), ratio in decode_ratio.items()
        ]
        for t in tp_levels
    }
    out["tp_levels"] = list(tp_levels)
    out["analytic"] = True
    out["method"] = (
        f"TP 1: measured ({measured.get('device')}, {measured.get('date')}). Other levels: "
        "each TP-1 point's measured/analytic ratio times the analytic estimate without "
        "collectives at that level, plus the analytic all-reduce cost "
        f"(nitsum.profiling.scaled; gpu {gpu.name}, model {model.name}). Nothing at TP > 1 "
        "was measured."
    )
    out["scaling"] = {
        "gpu": gpu.__dict__,
        "model": model.__dict__,
        "prefill_ratio": {str(k): r(v) for k, v in prefill_ratio.items()},
        "decode_ratio": {f"{b}x{c}": r(v) for (b, c), v in decode_ratio.items()},
    }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("measured", type=Path, help="a measured TP-1 nitsum-profile/1 JSON")
    ap.add_argument("--gpu", choices=sorted(GPUS), required=True)
    ap.add_argument("--model", choices=sorted(MODELS), required=True)
    ap.add_argument("--tp", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    measured = json.loads(args.measured.read_text())
    if measured.get("analytic") or measured.get("tp_levels") != [1]:
        print("scaled: needs a measured profile of TP 1 only", file=sys.stderr)
        return 2
    if 1 not in args.tp:
        print("scaled: --tp must include 1 (the measured level)", file=sys.stderr)
        return 2
    out = scale(measured, GPUS[args.gpu], MODELS[args.model], sorted(args.tp))
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
