"""Shared pieces of the per-request binding tests (test_tp_binding.py, test_bind_choice.py):
the pool's settings, a PoolEngine that records every request's tokens and steps, and
`nitsum-profile/1` profiles written for the cost model (scheduler-rs/src/binding/)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from nitsum.engine.engine_config import EngineConfig
from nitsum.pool.device_pool import DevicePool
from nitsum.pool.pool_engine import PoolEngine
from nitsum.sampling import SamplingParams
from shapes import layout

P = 4
PAGES = 20  # one device holds 80 tokens at TP 1, a TP-2 group 160
# NOTE: decisions as the written profiles say, not scaled by the steps timed on this machine.
ECFG = EngineConfig(
    page_tokens=P, token_budget=64, tp_levels=(1, 2), prefix_caching=False, bind_calibrate=False
)


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)


def write_profile(path: Path, prefill_ms: dict[int, float], decode_ms: dict[int, float]) -> str:
    """A profile whose prefill costs `prefill_ms[tp]` per token and whose decode step costs
    `decode_ms[tp] × (1 + batch / 10)` at any context; returns its path."""
    profile = {
        "schema": "nitsum-profile/1",
        "device": "test",
        "model": "tiny",
        "dtype": "float32",
        "max_context": 4096,
        "tp_levels": sorted(prefill_ms),
        "prefill": {
            str(tp): [{"tokens": t, "ms": ms * t} for t in (1, 4096)]
            for tp, ms in prefill_ms.items()
        },
        "decode": {
            str(tp): [
                {"batch": b, "context": c, "ms": ms * (1 + 0.1 * b)}
                for b in (1, 64)
                for c in (1, 4096)
            ]
            for tp, ms in decode_ms.items()
        },
    }
    path.write_text(json.dumps(profile))
    return str(path)


class Run:
    """A PoolEngine of two DP replicas; records every request's tokens, the steps they came
    in, and the prompt tokens each engine computed for each request."""

    def __init__(self, pool: DevicePool, cfg, ecfg: EngineConfig = ECFG, **knobs) -> None:
        self.pe = PoolEngine(
            pool,
            cfg,
            replace(ecfg, **knobs),
            PAGES,
            layout((0,), (1,)),
        )
        self.out: dict[str, list[int]] = {}
        self.steps: dict[str, list[int]] = {}
        self.computed: dict[str, int] = {}
        self.n = 0

    def step(self) -> None:
        for engine in [*self.pe.engines.values(), *(e for _, e in self.pe.binder.engines())]:
            self._watch(engine)
        for o in self.pe.step():
            self.out.setdefault(o.request_id, []).extend(o.new_token_ids)
            self.steps.setdefault(o.request_id, []).append(self.n)
        self.n += 1

    def _watch(self, engine) -> None:
        if getattr(engine, "_watched", False):
            return
        plain = engine.begin_step

        def begin_step():
            batch = plain()
            for s in batch:
                if s.start < len(s.seq.prompt_ids):
                    rid = s.seq.request_id
                    self.computed[rid] = self.computed.get(rid, 0) + s.q_len
            return batch

        engine.begin_step, engine._watched = begin_step, True

    def finish(self) -> None:
        while self.pe.has_unfinished():
            self.step()
        self.step()  # the release happens at the end of a step
        assert not self.pe.binder.bindings
        for d, (used, owned) in self.pe.page_accounting().items():
            assert used == owned == set(), d
