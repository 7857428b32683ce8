"""Measure prefill and decode latency per TP level on local devices (docs/profile-schema.md).

Each point runs real forwards on a DevicePool group (all ranks in lockstep): prefill of a
batch of prompt tokens, and one decode step of `batch` sequences at `context` tokens each.
Groups of ≥ 2 devices are measured twice, as TP and as SP (the SP stage): the crossover of the
two is the group's shift threshold (parallel/shift.py). The KV contents are whatever the
pages hold: latency does not depend on them. The prompts' token ids do matter on a GPU: each
point's prompts are seeded random ids from the whole vocabulary (`prompt_ids`), as real text
gives (docs/gpu.md, "Prefill: the profile against bench_prefill").
"""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable
from datetime import date

import torch
from tqdm import tqdm

from nitsum import __version__
from nitsum.config import ModelConfig
from nitsum.engine.request_spec import RequestSpec
from nitsum.engine.scheduled import Scheduled
from nitsum.engine.sequence import Sequence
from nitsum.engine.step_inputs import build_pipeline_inputs, build_step_inputs
from nitsum.parallel.pipeline import DEFAULT_PP_LEVELS
from nitsum.parallel.shift import crossover
from nitsum.parallel.topology import GroupShape
from nitsum.pool.pool_engine import PoolEngine
from nitsum.sampling import SamplingParams

PREFILL_TOKENS = (16, 64, 128, 256, 512, 1024)
DECODE_BATCHES = (1, 2, 4, 8, 16, 32)
DECODE_CONTEXTS = (128, 512, 1024)


def _wait(out: object) -> None:
    """Wait for a step's result: a CUDA step returns before its kernels finish."""
    if isinstance(out, torch.Tensor) and out.is_cuda:
        torch.cuda.synchronize(out.device)


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    _wait(fn())  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        _wait(fn())
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def fits(pe: PoolEngine, shape: GroupShape, items: list[tuple[int, int]]) -> bool:
    """Whether the group's free KV pages hold these sequences (a GPU's largest decode points,
    e.g. 256 sequences of 8k tokens, do not: they are left out, as the analytic profile
    leaves them out)."""
    pages = pe.alloc.group(shape.members, shape.tp)
    return sum(pages.pages_for(ctx) for ctx, _ in items) <= pages.num_free


def prompt_ids(n: int, vocab: int, seed: int) -> list[int]:
    """`n` token ids drawn uniformly from the vocabulary, seeded.

    NOTE: never one id repeated. With `[1] * n` (the 2026-11-27 H200 profile's prompts) every
    row of every layer's input is the same vector (the values attention averages are all
    equal), and a GPU runs a matmul of such predictable data at higher clocks than one of
    real activations: that profile's 2,048-token prefill took 45.1 ms against bench_prefill's
    50.6 ms on random ids (docs/gpu.md)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


class GroupStep:
    """One forward of sequences given as (context, q_len) on `group`, repeatable; `release`
    frees the pages it holds."""

    def __init__(
        self,
        pe: PoolEngine,
        shape: GroupShape,
        items: list[tuple[int, int]],
        sequence_parallel: bool = False,
        constant_ids: bool = False,
    ):
        """A pipeline `shape` runs one micro-batch per stage (as the engine does). Prompts are
        random ids (`prompt_ids`, seeded by position in `items`); `constant_ids`: every id 1,
        the 2026-11-27 profile's prompts (scripts/bench_prefill.py measures both)."""
        self.pe, self.group = pe, shape.members
        self.pages = pe.alloc.group(shape.members, shape.tp)
        self.batch = []
        vocab = pe.cfg.vocab_size
        for i, (ctx, q_len) in enumerate(items):
            ids = [1] * ctx if constant_ids else prompt_ids(ctx, vocab, seed=i)
            seq = Sequence(f"p{i}", ids, RequestSpec(SamplingParams(temperature=0)))
            seq.pages = self.pages.allocate(self.pages.pages_for(ctx))
            self.batch.append(Scheduled(seq, ctx - q_len, q_len))
        tpp = self.pages.tokens_per_page
        if shape.is_pipeline:
            self.inputs = build_pipeline_inputs(self.batch, tpp, shape.tp, shape.pp)
        else:
            self.inputs = build_step_inputs(self.batch, tpp, sequence_parallel)

    def __call__(self) -> object:
        self.pe.pool.launch_step(self.group, self.inputs)
        return self.pe.pool.collect_step(self.group)

    def release(self) -> None:
        for item in self.batch:
            self.pages.release(item.seq.pages)


def _sweep(
    pe: PoolEngine,
    shape: GroupShape,
    sp: bool,
    repeats: int,
    prefill_tokens: tuple[int, ...],
    batches: tuple[int, ...],
    contexts: tuple[int, ...],
    bar: tqdm,
) -> tuple[list[dict], list[dict]]:
    """Prefill and decode points of the group `shape` in one mode (TP, SP, or a pipeline)."""
    prefill = []
    for n in prefill_tokens:
        fn = GroupStep(pe, shape, [(n, n)], sp)
        prefill.append({"tokens": n, "ms": round(median_ms(fn, repeats), 3)})
        fn.release()
        bar.update()
    decode = []
    for b in batches:
        for c in contexts:
            if not fits(pe, shape, [(c, 1)] * b):
                bar.update()
                continue
            fn = GroupStep(pe, shape, [(c, 1)] * b, sp)
            decode.append({"batch": b, "context": c, "ms": round(median_ms(fn, repeats), 3)})
            fn.release()
            bar.update()
    return prefill, decode


def shift_threshold(
    prefill: list[dict], decode: list[dict], sp_prefill: list[dict], sp_decode: list[dict]
) -> int | None:
    """Batched tokens above which a group runs SP (None: TP only), fitted over every measured
    point of both modes: a prefill of n tokens batches n, a decode step of b sequences b."""
    sp_at: dict[tuple[str, ...], float] = {("p", p["tokens"]): p["ms"] for p in sp_prefill}
    sp_at |= {("d", p["batch"], p["context"]): p["ms"] for p in sp_decode}
    points = [(p["tokens"], p["ms"], sp_at[("p", p["tokens"])]) for p in prefill]
    points += [(p["batch"], p["ms"], sp_at[("d", p["batch"], p["context"])]) for p in decode]
    return crossover(points)


def measure_profile(
    pe: PoolEngine,
    cfg: ModelConfig,
    model_name: str,
    device_kind: str,
    repeats: int = 3,
    prefill_tokens: tuple[int, ...] = PREFILL_TOKENS,
    batches: tuple[int, ...] = DECODE_BATCHES,
    contexts: tuple[int, ...] = DECODE_CONTEXTS,
) -> dict:
    """Sweep every TP level the pool allows, groups of ≥ 2 devices in TP and in SP; returns a
    `nitsum-profile/1` dict."""
    levels = list(pe.allowed)
    prefill: dict[str, list[dict]] = {}
    decode: dict[str, list[dict]] = {}
    sp_prefill: dict[str, list[dict]] = {}
    sp_decode: dict[str, list[dict]] = {}
    thresholds: dict[str, int | None] = {}
    pp_prefill: dict[str, list[dict]] = {}
    pp_decode: dict[str, list[dict]] = {}
    # One pipeline of each shape (the first block of devices), e.g. "2x2": TP 2 x PP 2.
    shapes = {
        f"{s.tp}x{s.pp}": s
        for s in pe.topology.pipelines(cfg.num_layers, DEFAULT_PP_LEVELS)
        if s.members[0] == 0
    }
    per_mode = len(prefill_tokens) + len(batches) * len(contexts)
    points = sum(per_mode * (2 if tp > 1 else 1) for tp in levels) + per_mode * len(shapes)
    grid = (prefill_tokens, batches, contexts)
    with tqdm(total=points, desc="profiling", unit="pt") as bar:
        for tp in levels:
            key = str(tp)
            group = GroupShape.tp_group(tuple(range(tp)))
            prefill[key], decode[key] = _sweep(pe, group, False, repeats, *grid, bar)
            if tp > 1:
                sp_prefill[key], sp_decode[key] = _sweep(pe, group, True, repeats, *grid, bar)
                thresholds[key] = shift_threshold(
                    prefill[key], decode[key], sp_prefill[key], sp_decode[key]
                )
        for key, shape in shapes.items():
            pp_prefill[key], pp_decode[key] = _sweep(pe, shape, False, repeats, *grid, bar)
    return {
        "schema": "nitsum-profile/1",
        "device": device_kind,
        "model": model_name,
        "dtype": str(pe.ecfg.dtype).removeprefix("torch."),
        "analytic": False,
        "date": date.today().isoformat(),
        "versions": {
            "torch": torch.__version__,
            "nitsum": __version__,
            "python": platform.python_version(),
        },
        "host": {"cpu_count": torch.get_num_threads(), "machine": platform.machine()},
        "max_context": cfg.max_position_embeddings,
        "tp_levels": levels,
        "prefill": prefill,
        "decode": decode,
        "sp_prefill": sp_prefill,
        "sp_decode": sp_decode,
        # Batched tokens above which each group size runs SP (null: TP only).
        "shift_threshold": thresholds,
        # Pipelines ("TPxPP": stages of TP devices), one micro-batch per stage.
        "pipelines": sorted(shapes),
        "pp_prefill": pp_prefill,
        "pp_decode": pp_decode,
    }
