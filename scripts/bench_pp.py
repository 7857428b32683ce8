"""Pipeline parallelism as runtime state on 4 CPU device processes, side by side in one run.

A random Llama (8 heads, 4 KV heads, `--hidden` x `--layers`) on 4 device processes of one
thread each.

1. Switch time per transition TP4 -> (2,2) -> (1,4) -> TP4 (TP x PP), with no KV and with the
   KV of `--requests` running requests, against a restart of the same layout (new device
   processes loading the weights, building their contexts and running one step: what a
   restart-based switch pays at least). Bytes sent per switch against the (layer, head)
   slices whose owner changed (each must move exactly once).
2. Decode step latency and tokens/s of (4,1), (2,2), (1,4) at a small and a large batch (context
   256), interleaved rounds, best of each.

Targets: each switch with KV >= 100x faster than a restart; bytes sent = bytes whose owner
changed.

    python scripts/bench_pp.py [--hidden 512] [--layers 8] [--requests 16] [--rounds 7]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from nitsum.config import ModelConfig  # noqa: E402
from nitsum.engine.engine_config import EngineConfig  # noqa: E402
from nitsum.engine.request_spec import RequestSpec
from nitsum.parallel.topology import GroupShape  # noqa: E402
from nitsum.pool.device_pool import DevicePool  # noqa: E402
from nitsum.pool.device_proc import ModelSource  # noqa: E402
from nitsum.pool.pool_engine import PoolEngine  # noqa: E402
from nitsum.profiling.measure import GroupStep  # noqa: E402
from nitsum.sampling import SamplingParams  # noqa: E402
from tiny import layout_slices, random_llama, random_prompt  # noqa: E402

ALL = (0, 1, 2, 3)
TP4 = GroupShape.tp_group(ALL)
# (label, the group's shape)
LAYOUTS = [
    ("TP4 (4,1)", GroupShape(ALL, 4, 1)),
    ("(2,2)", GroupShape(ALL, 2, 2)),
    ("(1,4)", GroupShape(ALL, 1, 4)),
    ("TP4 (4,1)", GroupShape(ALL, 4, 1)),
]
ECFG = EngineConfig(page_tokens=16, tp_levels=(1, 2, 4), prefix_caching=False)
PAGES = 1024


def switches(pool: DevicePool, cfg: ModelConfig, requests: int) -> dict[str, list[float]]:
    """Each transition of LAYOUTS without KV, then twice with running requests' KV (the
    first round pays first-use costs of this machine's links and buffers), in ms."""
    out: dict[str, list[float]] = {"no KV": [], "KV, 1st round": [], "KV, 2nd round": []}
    for name in out:
        with_kv = name != "no KV"
        pe = PoolEngine(pool, cfg, ECFG, PAGES, [TP4])
        if with_kv:
            greedy = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
            for i in range(requests):
                pe.add_request(f"r{i}", random_prompt(cfg, 240, i), RequestSpec(greedy))
            while any(s.num_computed < 240 for s in pe.engines[TP4].sequences()):
                pe.step()
        for (_, before), (label, after) in zip(LAYOUTS, LAYOUTS[1:], strict=False):
            tokens = sum(s.num_computed for e in pe.engines.values() for s in e.sequences())
            old = layout_slices(cfg, [before])
            new = layout_slices(cfg, [after])
            changed = sum(len(new[d] - old[d]) for d in new) * tokens * 2 * cfg.head_dim * 4
            report = pe.reconfigure([after])
            assert report.ok, report.error
            ms = report.timings_ms["total"]
            out[name].append(ms)
            print(
                f"[switch] {name:13s} -> {label:10s}: {ms:7.2f} ms, "
                f"{report.moved_requests} requests ({tokens} tokens) moved, "
                f"{report.bytes_sent / 2**20:6.1f} MiB sent = {changed / 2**20:6.1f} MiB whose "
                f"owner changed ({'exact' if report.bytes_sent == changed else 'MISMATCH'}); "
                f"phases {', '.join(f'{k} {v:.1f}' for k, v in report.timings_ms.items())}"
            )
            if with_kv:
                pe.step()  # the requests go on in the new layout
    return out


def restart_ms(source: ModelSource, cfg: ModelConfig) -> float:
    """New device processes for a layout, up to their first step (ms)."""
    t0 = time.perf_counter()
    with DevicePool(4, source, ECFG, PAGES, levels=(1, 2, 4)) as pool:
        pe = PoolEngine(pool, cfg, ECFG, PAGES, [TP4])
        step = GroupStep(pe, GroupShape.tp_group(ALL), [(16, 16)])
        step()
        ms = (time.perf_counter() - t0) * 1e3
    return ms


def decode(pool: DevicePool, cfg: ModelConfig, rounds: int) -> None:
    """Decode step latency of each layout at batch 1 and 32 (context 256), interleaved."""
    pe = PoolEngine(pool, cfg, ECFG, PAGES, [TP4])
    for batch in (1, 32):
        items = [(256, 1)] * batch
        steps = {label: GroupStep(pe, shape, items) for label, shape in LAYOUTS[:3]}
        ms: dict[str, list[float]] = {label: [] for label in steps}
        for step in steps.values():
            step()
        for _ in range(rounds):
            for label, step in steps.items():
                t0 = time.perf_counter()
                step()
                ms[label].append((time.perf_counter() - t0) * 1e3)
        for step in steps.values():
            step.release()
        best = {label: min(v) for label, v in ms.items()}
        tp4 = best[LAYOUTS[0][0]]
        print(
            f"[decode] batch {batch:2d}: "
            + "  ".join(
                f"{label} {m:6.1f} ms/token ({batch / m * 1e3:6.0f} tok/s, {tp4 / m:.2f}x TP4)"
                for label, m in best.items()
            )
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    hf, cfg = random_llama(args.hidden, args.layers)
    source = ModelSource(hf_config=cfg.extra, state_dict=hf.state_dict())
    with DevicePool(4, source, ECFG, PAGES, levels=(1, 2, 4)) as pool:
        times = switches(pool, cfg, args.requests)
        decode(pool, cfg, args.rounds)
    restart = restart_ms(source, cfg)
    for name in ("KV, 1st round", "KV, 2nd round"):
        worst = max(times[name])
        print(
            f"[switch] restart of a layout: {restart:.0f} ms; the slowest switch with KV "
            f"({name}) {worst:.1f} ms: {restart / worst:.0f}x faster (target >= 100x)"
        )


if __name__ == "__main__":
    main()
