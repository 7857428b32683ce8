"""gpu_check.sh's `tp` section: every multi-device mechanism on device processes that share
one GPU (`EngineConfig.devices_per_gpu`: their collectives over CUDA IPC buffers, their KV
moves read straight from each other's pages), each checked against TP 1's greedy tokens.

1. greedy: the same prompts at TP 1, TP 2 and TP 4 give the same greedy tokens.
2. switch: 16 requests decode while the pool switches 1 -> 2 -> 4 -> 1; every request
   completes with its unswitched tokens; each switch's time and bytes moved.
3. switch_no_kv: p50 / p99 of switches with nothing running (target <= 1 ms).
4. kv_move: GB/s of one migration between two device processes (the receiver's time inside
   it) against a device-to-device copy of the same bytes in one of them (target >= 50%).
5. bind: a request bound DP -> TP 2; sp: a TP-2 group stepping in SP; pp: a 2-stage
   pipeline: each gives TP 1's tokens.
6. graphs: recordings, replays and the cuts at collectives a shared GPU needs.

fp32 weights and KV: a TP group's partial sums add up in another order than one GEMM's, far
below a random model's logit gaps, so greedy tokens must agree exactly. On a shared GPU the
processes' kernels are time-sliced: its timings say what the mechanisms cost there, not what
a node of GPUs would give. `--device cpu` is the dry run (CPU device processes, tiny shape).

    python scripts/gpu_tp.py --device cuda [--layers 4] --json tp.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nitsum.config import ModelConfig  # noqa: E402
from nitsum.engine.engine_config import EngineConfig  # noqa: E402
from nitsum.engine.request_spec import RequestSpec  # noqa: E402
from nitsum.parallel.shift import ShiftRule  # noqa: E402
from nitsum.parallel.topology import GroupShape  # noqa: E402
from nitsum.pool.device_commands import Counters, Probe  # noqa: E402
from nitsum.pool.device_pool import DevicePool  # noqa: E402
from nitsum.pool.device_proc import Device, ModelSource  # noqa: E402
from nitsum.pool.migration_plan import Piece  # noqa: E402
from nitsum.pool.pool_engine import PoolEngine  # noqa: E402
from nitsum.sampling import SamplingParams  # noqa: E402
from random_model import hf_config, write_model  # noqa: E402

DEVICES = 4
TP1 = [GroupShape.tp_group((d,)) for d in range(4)]
TP2 = [GroupShape.tp_group((0, 1)), GroupShape.tp_group((2, 3))]
TP4 = [GroupShape.tp_group((0, 1, 2, 3))]
REQUESTS = 16
NEW_TOKENS = 24


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def make_model(out: Path, cuda: bool, layers: int) -> ModelConfig:
    """A random Llama: the 8B shape cut to `layers` layers on a GPU, a tiny one on CPU."""
    cfg = hf_config(layers, 4096, 32, 8, 128256) if cuda else hf_config(layers, 256, 8, 4, 1024)
    # NOTE: written in bf16 (half the bytes to write and load), run in fp32.
    write_model(out, cfg, "cuda" if cuda else "cpu", torch.bfloat16)
    return ModelConfig.from_hf(json.loads((out / "config.json").read_text()))


def prompts(cfg: ModelConfig, n: int, lo: int, hi: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    lens = torch.randint(lo, hi, (n,), generator=g).tolist()
    return [torch.randint(0, cfg.vocab_size, (k,), generator=g).tolist() for k in lens]


def greedy() -> RequestSpec:
    return RequestSpec(SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True))


def drain(pe: PoolEngine, out: dict[str, list[int]], steps: int | None = None) -> None:
    n = 0
    while pe.has_unfinished() and (steps is None or n < steps):
        for o in pe.step():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
        n += 1


def serve(
    pool: DevicePool, cfg: ModelConfig, ecfg: EngineConfig, pages: int, groups: list, ps: list,
    spec: RequestSpec | None = None,
) -> tuple[PoolEngine, dict[str, list[int]]]:  # fmt: skip
    """Every prompt on `groups` (the fewest requests first) to completion: (engine, tokens)."""
    pe = PoolEngine(pool, cfg, ecfg, pages, groups)
    for i, p in enumerate(ps):
        pe.add_request(f"r{i}", p, spec or greedy())
    out: dict[str, list[int]] = {}
    drain(pe, out)
    return pe, out


def d2d_copy(device: Device, nbytes: int) -> float:
    """Seconds for one copy of `nbytes` within this device process's memory (best of 3)."""
    dev = device.pool.storage.device
    src = torch.ones(nbytes // 4, device=dev)
    dst = torch.zeros_like(src)
    best = float("inf")
    for _ in range(3):
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        dst.copy_(src)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        best = min(best, time.perf_counter() - t0)
    return best


def kv_move(pool: DevicePool, cfg: ModelConfig, pages: int, page_tokens: int) -> dict[str, Any]:
    """Half of device 0's pages to the other half of device 1's, in place (best of 3): the
    receiver's time inside the move (waiting for the source's pages to be ready, the copies,
    the fence) against a device copy of the same bytes; the controller's wall time too (it
    adds pickling the slots to both processes and their replies)."""
    half = pages // 2 * page_tokens
    slots = torch.arange(half)
    piece = Piece(0, 1, 1, 0, 1, 0, cfg.num_kv_heads, slots, slots + half)
    nbytes = half * cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * 4
    best, wall = float("inf"), float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        stats = pool.migrate([piece])
        wall = min(wall, time.perf_counter() - t0)
        best = min(best, stats[1].seconds)
    copy = pool.call(1, Probe(d2d_copy, (nbytes,)))
    return {
        "bytes": nbytes,
        "seconds": best,
        "wall_seconds": wall,
        "gbps": nbytes / best / 1e9,
        "copy_gbps": nbytes / copy / 1e9,
        "of_copy": copy / best,
        "direct": stats[1].direct_copies > 0,
    }


def run(cuda: bool, layers: int, work: Path) -> dict[str, Any]:
    cfg = make_model(work / "model", cuda, layers)
    kv_mib = 4096 if cuda else 64  # a 2 GiB move on the GPU: long against launch overheads
    ecfg = EngineConfig(
        dtype=torch.float32,
        device="cuda" if cuda else "cpu",
        kv_cache_bytes=kv_mib << 20,
        max_batch=16,
        token_budget=256,
        tp_levels=(1, 2, 4),
        devices_per_gpu=DEVICES if cuda else 1,
        decode_graphs=True,
        piecewise_graphs=True,
    )
    from nitsum.engine.device_build import pages_for_config

    pages = pages_for_config(cfg, ecfg)
    ps = prompts(cfg, REQUESTS, 16, 200 if cuda else 60)
    out: dict[str, Any] = {"devices": DEVICES, "layers": cfg.num_layers, "gpu": cuda}
    t0 = time.perf_counter()
    source = ModelSource(model_dir=str(work / "model"))
    with DevicePool(DEVICES, source, ecfg, pages, levels=(1, 2, 4)) as pool:
        out["start_s"] = time.perf_counter() - t0
        out["collectives"] = pool.call(0, Counters())["collectives"]
        # 1. greedy at TP 1, 2, 4
        _, ref = serve(pool, cfg, ecfg, pages, TP1, ps[:4])
        out["greedy"] = {
            f"tp{g[0].tp}": serve(pool, cfg, ecfg, pages, g, ps[:4])[1] == ref for g in (TP2, TP4)
        }
        # 2. 1 -> 2 -> 4 -> 1 with 16 requests in flight
        _, unswitched = serve(pool, cfg, ecfg, pages, TP1, ps)
        pe = PoolEngine(pool, cfg, ecfg, pages, TP1)
        for i, p in enumerate(ps):
            pe.add_request(f"r{i}", p, greedy())
        got: dict[str, list[int]] = {}
        switches = []
        for layout in (TP2, TP4, TP1):
            drain(pe, got, steps=4)
            report = pe.reconfigure(layout)
            switches.append({
                "to": layout[0].tp, "ok": report.ok, "ms": report.timings_ms["total"],
                "moved": report.moved_requests, "bytes": report.bytes_moved,
            })  # fmt: skip
        drain(pe, got)
        out["switch"] = {
            "same_tokens": got == unswitched,
            "completed": sum(len(t) == NEW_TOKENS for t in got.values()),
            "requests": REQUESTS,
            "switches": switches,
        }
        # 3. switches with nothing running
        times = []
        for i in range(30):
            t1 = time.perf_counter()
            assert pe.reconfigure((TP2, TP4, TP1)[i % 3]).ok
            times.append((time.perf_counter() - t1) * 1e3)
        out["switch_no_kv"] = {"p50_ms": pct(times, 0.5), "p99_ms": pct(times, 0.99)}
        # 5. bound DP -> TP 2, an SP group, a 2-stage pipeline
        bound = RequestSpec(greedy().sampling, bind_tp=2, ttft_ms=60_000)
        pe, got = serve(pool, cfg, ecfg, pages, TP1, ps[:1], bound)
        out["bind"] = {
            "same_tokens": got["r0"] == ref["r0"],
            "binds": pe.all_counters()["tp_binds"],
        }
        sp = replace(ecfg, shift=ShiftRule(threshold=0))
        pe, got = serve(pool, cfg, sp, pages, TP2, ps[:2])
        out["sp"] = {
            "same_tokens": got == {k: ref[k] for k in got},
            "sp_steps": pe.counters["sp_steps"],
        }
        pe = PoolEngine(pool, cfg, ecfg, pages, TP1)
        assert pe.reconfigure([GroupShape((0, 1), 1, 2), *TP1[2:]]).ok
        for i, p in enumerate(ps[:2]):
            pe.add_request(f"r{i}", p, greedy(), group=GroupShape((0, 1), 1, 2))
        got = {}
        drain(pe, got)
        out["pp"] = {
            "same_tokens": got == {k: ref[k] for k in got},
            "pp_steps": pe.counters["pp_steps"],
        }
        # 4. a KV move against a copy of the same bytes
        out["kv_move"] = kv_move(pool, cfg, pages, ecfg.page_tokens)
        # 6. recordings
        counters = [pool.call(d, Counters()) for d in range(DEVICES)]
        keys = ("graph_captures", "graph_replays", "piecewise_replays", "graph_cuts")
        out["graphs"] = {k: sum(c[k] for c in counters) for k in keys}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        out = run(args.device == "cuda", args.layers, Path(work))
    text = json.dumps(out, indent=1)
    print(text)
    if args.json is not None:
        args.json.write_text(text)
    ok = (
        all(out["greedy"].values())
        and out["switch"]["same_tokens"]
        and all(s["ok"] for s in out["switch"]["switches"])
        and all(out[k]["same_tokens"] for k in ("bind", "sp", "pp"))
        and out["kv_move"]["direct"]
    )
    print("tp: all tokens agree" if ok else "tp: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
