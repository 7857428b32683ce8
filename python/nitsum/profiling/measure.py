"""Measure prefill and decode latency per TP level on local devices (docs/profile-schema.md).

Each point runs real forwards on a DevicePool group (all ranks in lockstep): prefill of a
batch of prompt tokens, and one decode step of `batch` sequences at `context` tokens each.
The KV contents are whatever the pages hold: latency does not depend on the values.
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
from nitsum.engine.scheduler import Scheduled
from nitsum.engine.sequence import Sequence
from nitsum.engine.step_inputs import build_step_inputs
from nitsum.pool.pool_engine import PoolEngine
from nitsum.sampling import SamplingParams

PREFILL_TOKENS = (16, 64, 128, 256, 512, 1024)
DECODE_BATCHES = (1, 2, 4, 8, 16, 32)
DECODE_CONTEXTS = (128, 512, 1024)


def _timed(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


class _Step:
    """One forward of sequences given as (context, q_len) on `group`, repeatable; `release`
    frees the pages it holds."""

    def __init__(self, pe: PoolEngine, group: tuple[int, ...], items: list[tuple[int, int]]):
        self.pe, self.group = pe, group
        self.pages = pe.alloc.group(group)
        self.batch = []
        for i, (ctx, q_len) in enumerate(items):
            seq = Sequence(f"p{i}", [1] * ctx, SamplingParams(temperature=0))
            seq.pages = self.pages.allocate(self.pages.pages_for(ctx))
            self.batch.append(Scheduled(seq, ctx - q_len, q_len))
        self.inputs = build_step_inputs(self.batch, self.pages.tokens_per_page)

    def __call__(self) -> object:
        self.pe.pool.launch_step(self.group, self.inputs)
        return self.pe.pool.collect_step(self.group)

    def release(self) -> None:
        for item in self.batch:
            self.pages.release(item.seq.pages)


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
    """Sweep every TP level the pool allows; returns a `nitsum-profile/1` dict."""
    levels = list(pe.allowed)
    prefill: dict[str, list[dict]] = {}
    decode: dict[str, list[dict]] = {}
    points = len(levels) * (len(prefill_tokens) + len(batches) * len(contexts))
    with tqdm(total=points, desc="profiling", unit="pt") as bar:
        for tp in levels:
            group = tuple(range(tp))
            prefill[str(tp)] = []
            for n in prefill_tokens:
                fn = _Step(pe, group, [(n, n)])
                prefill[str(tp)].append({"tokens": n, "ms": round(_timed(fn, repeats), 3)})
                fn.release()
                bar.update()
            decode[str(tp)] = []
            for b in batches:
                for c in contexts:
                    fn = _Step(pe, group, [(c, 1)] * b)
                    ms = _timed(fn, repeats)
                    decode[str(tp)].append({"batch": b, "context": c, "ms": round(ms, 3)})
                    fn.release()
                    bar.update()
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
    }
