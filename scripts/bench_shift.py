"""Shift parallelism on CPU device processes: TP, SP and the shift rule side by side in one run.

A random Llama (8 heads, `--kv-heads` KV heads, `--hidden` × `--layers`) on `--devices`
device processes of one thread each, one group of all of them. Iterations of growing batched
tokens: decode steps of b sequences at 256 tokens of context, and prefill forwards of n prompt
tokens. First a calibration pass measures both modes once and takes the crossover (what
`nitsum profile` writes as `shift_threshold`); then each point runs TP, SP, shift (the rule
at that threshold) and shift again (the A/A noise floor) in interleaved rounds, and reports
the best of the rounds. Then interactive (one request at a time) and batch (32 at once)
traffic end to end under each rule, and the weight bytes per device.

Targets: shift >= 0.95x the better of TP and SP at every point; >= 1.3x TP at the largest.

    python scripts/bench_shift.py [--devices 2] [--kv-heads 4] [--hidden 256] [--layers 4]
                                  [--rounds 15]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from device_probes import weight_bytes  # noqa: E402
from nitsum.engine.engine_config import EngineConfig  # noqa: E402
from nitsum.engine.request_spec import RequestSpec
from nitsum.parallel.shift import ShiftRule  # noqa: E402
from nitsum.parallel.topology import GroupShape  # noqa: E402
from nitsum.pool.device_commands import Probe  # noqa: E402
from nitsum.pool.device_pool import DevicePool  # noqa: E402
from nitsum.pool.device_proc import ModelSource  # noqa: E402
from nitsum.pool.pool_engine import PoolEngine  # noqa: E402
from nitsum.profiling.measure import GroupStep, shift_threshold  # noqa: E402
from nitsum.sampling import SamplingParams  # noqa: E402
from tiny import random_llama, random_prompt  # noqa: E402

DECODE_BATCHES = (1, 4, 16, 64, 256)
PREFILL_TOKENS = (64, 256, 1024, 2048)
CONTEXT = 256
WORKLOADS = {"interactive 1x(512+64)": (1, 512, 64), "batch 32x(256+64)": (32, 256, 64)}
# `--smoke` (tests/test_scripts_smoke.py): every section at sizes that run in seconds.
SMOKE_SIZES = (
    (1, 4),
    (64, 128),
    {"interactive 1x(32+4)": (1, 32, 4), "batch 4x(32+4)": (4, 32, 4)},
)


def points(
    decode: tuple[int, ...] = DECODE_BATCHES, prefill: tuple[int, ...] = PREFILL_TOKENS
) -> list[tuple[str, int, list[tuple[int, int]]]]:
    """(label, batched tokens, items as (context, q_len)) for every measured iteration."""
    out = [(f"decode b={b}", b, [(CONTEXT, 1)] * b) for b in decode]
    return out + [(f"prefill n={n}", n, [(n, n)]) for n in prefill]


def interleaved_ms(
    pe: PoolEngine, group: tuple[int, ...], items, modes: dict[str, bool], rounds: int
) -> dict[str, float]:
    """Best-of-`rounds` ms of one forward of `items` on `group` per mode (name -> SP?), the
    modes run in turn each round. NOTE: the best, not the median: a forward is deterministic
    work, and on 2 shared cores a single run jitters by +-20% (gloo's wake-ups), which the
    minimum filters out; a slow moment hits every mode alike either way."""
    step = GroupStep(
        pe, GroupShape.tp_group(group), items
    )  # the same pages and KV serve every mode
    inputs = {name: replace(step.inputs, sequence_parallel=sp) for name, sp in modes.items()}
    ms: dict[str, list[float]] = {name: [] for name in modes}
    try:
        for name in modes:
            step.inputs = inputs[name]
            step()  # warm-up
        for _ in range(rounds):
            for name in modes:
                step.inputs = inputs[name]
                t0 = time.perf_counter()
                step()
                ms[name].append((time.perf_counter() - t0) * 1e3)
    finally:
        step.release()
    return {name: min(v) for name, v in ms.items()}


def calibrate(
    pe: PoolEngine,
    group: tuple[int, ...],
    rounds: int,
    batches: tuple[int, ...] = DECODE_BATCHES,
    tokens: tuple[int, ...] = PREFILL_TOKENS,
) -> int | None:
    """The crossover fitted (as `nitsum profile` fits it) to the best of a few interleaved
    rounds of both modes at every point."""
    both = {"tp": False, "sp": True}
    decode = {m: [] for m in both}
    prefill = {m: [] for m in both}
    for b in batches:
        med = interleaved_ms(pe, group, [(CONTEXT, 1)] * b, both, rounds)
        for m in both:
            decode[m].append({"batch": b, "context": CONTEXT, "ms": med[m]})
    for n in tokens:
        med = interleaved_ms(pe, group, [(n, n)], both, rounds)
        for m in both:
            prefill[m].append({"tokens": n, "ms": med[m]})
    return shift_threshold(prefill["tp"], decode["tp"], prefill["sp"], decode["sp"])


def serve(pe: PoolEngine, cfg, requests: int, prompt: int, output: int) -> dict[str, float]:
    """Serve `requests` requests of `prompt` + `output` tokens, all arriving at once, to the
    end: mean TTFT, mean TPOT and total output tokens/s."""
    greedy = SamplingParams(max_tokens=output, temperature=0, ignore_eos=True)
    start = time.perf_counter()
    for i in range(requests):
        pe.add_request(f"q{i}", random_prompt(cfg, prompt, i), RequestSpec(greedy))
    first: dict[str, float] = {}
    done: dict[str, float] = {}
    while pe.has_unfinished():
        for o in pe.step():
            now = time.perf_counter() - start
            if o.new_token_ids:
                first.setdefault(o.request_id, now)
            if o.finished:
                done[o.request_id] = now
    ttft = statistics.mean(first.values())
    tpot = statistics.mean((done[r] - first[r]) / (output - 1) for r in done)
    return {"ttft": ttft, "tpot": tpot, "tok_s": requests * output / max(done.values())}


def end_to_end(
    pe: PoolEngine, cfg, group: tuple[int, ...], rules: dict[str, ShiftRule], workloads: dict
) -> None:
    """Interactive (one request at a time) and batch (many at once) traffic, per rule."""
    engines = {name: engine_with(pe, group, rule) for name, rule in rules.items()}
    for label, (n, prompt, output) in workloads.items():
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in rules}
        for _ in range(2):
            for name, e in engines.items():
                runs[name].append(serve(e, cfg, n, prompt, output))
        med = {
            name: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
            for name, rs in runs.items()
        }
        line = "  ".join(
            f"{name} TTFT {m['ttft'] * 1e3:6.0f} ms TPOT {m['tpot'] * 1e3:5.1f} ms "
            f"{m['tok_s']:6.0f} tok/s"
            for name, m in med.items()
        )
        tp, shift = med["TP"], med["shift"]
        print(f"[e2e] {label}: {line}")
        print(
            f"[e2e]   shift vs TP: TTFT {tp['ttft'] / shift['ttft']:.2f}x, TPOT "
            f"{tp['tpot'] / shift['tpot']:.2f}x, throughput {shift['tok_s'] / tp['tok_s']:.2f}x"
        )


def engine_with(pe: PoolEngine, group: tuple[int, ...], rule: ShiftRule) -> PoolEngine:
    """A PoolEngine over the same devices whose group follows `rule`."""
    ecfg, shape = replace(pe.ecfg, shift=rule), GroupShape.tp_group(group)
    return PoolEngine(pe.pool, pe.cfg, ecfg, pe.alloc.num_pages, [shape])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (the tests' smoke run)")
    args = ap.parse_args()
    decode, prefill, workloads = (
        SMOKE_SIZES if args.smoke else (DECODE_BATCHES, PREFILL_TOKENS, WORKLOADS)
    )
    hf, cfg = random_llama(args.hidden, args.layers, args.kv_heads)
    source = ModelSource(hf_config=cfg.extra, state_dict=hf.state_dict())
    levels = (1, args.devices)
    ecfg = EngineConfig(page_tokens=16, tp_levels=levels, prefix_caching=False)
    pages = 2048
    group = tuple(range(args.devices))
    with DevicePool(args.devices, source, ecfg, pages, levels=levels) as pool:
        pe = PoolEngine(pool, cfg, ecfg, pages, [GroupShape.tp_group(group)])
        threshold = calibrate(pe, group, max(3, args.rounds // 3), decode, prefill)
        rule = ShiftRule(threshold=threshold)
        print(f"[shift] {args.devices} devices, crossover: SP above {threshold} batched tokens")
        rows = []
        for label, tokens, items in points(decode, prefill):
            shift_sp = rule.sequence_parallel(len(group), tokens)
            # "again" repeats the shift's mode: the A/A spread is this machine's noise floor.
            modes = {"TP": False, "SP": True, "shift": shift_sp, "again": shift_sp}
            ms = interleaved_ms(pe, group, items, modes, args.rounds)
            best = min(ms["TP"], ms["SP"])
            noise = abs(ms["shift"] / ms["again"] - 1)
            picked, other = (ms["SP"], ms["TP"]) if shift_sp else (ms["TP"], ms["SP"])
            rows.append((label, tokens, ms, best, noise, picked > 1.05 * other))
            print(
                f"[shift] {label:14s} {tokens:5d} tok: TP {ms['TP']:7.2f} ms "
                f"({tokens / ms['TP'] * 1e3:6.0f} tok/s)  SP {ms['SP']:7.2f} ms "
                f"({tokens / ms['SP'] * 1e3:6.0f} tok/s)  shift[{'SP' if shift_sp else 'TP'}] "
                f"{ms['shift']:7.2f} ms: {best / ms['shift']:.2f}x the better, "
                f"{ms['TP'] / ms['shift']:.2f}x TP (A/A noise {noise:.0%})"
            )
        worst = min(rows, key=lambda r: r[3] / r[2]["shift"])
        label, _, ms, *_ = max(rows, key=lambda r: r[1])
        print(
            f"[shift] worst point ({worst[0]}): {worst[3] / worst[2]['shift']:.2f}x the better "
            f"mode, A/A noise there {worst[4]:.0%} (target >= 0.95); points where the rule "
            f"picked a mode > 5% slower than the other: {sum(r[5] for r in rows)}; "
            f"largest ({label}): {ms['TP'] / ms['shift']:.2f}x TP (target >= 1.3)"
        )
        rules = {"TP": ShiftRule(None), "SP": ShiftRule(0), "shift": rule}
        end_to_end(pe, cfg, group, rules, workloads)
        for d in range(args.devices):
            nbytes, shared = pool.call(d, Probe(weight_bytes, ()))
            print(
                f"[shift] device {d}: weights {nbytes / 2**20:.1f} MiB (one full copy: "
                f"{sum(p.numel() * 4 for p in hf.parameters()) / 2**20:.1f} MiB); "
                f"TP shards are views of it: {shared}; SP uses it as is"
            )


if __name__ == "__main__":
    main()
