"""Priority preemption (issue 13, item 1): a more important request arriving at a full engine
starts at once, the requests it displaced finish later with unchanged tokens."""

import pytest

from nitsum.engine.build import build_engine
from nitsum.engine.engine_config import EngineConfig
from nitsum.engine.request_spec import RequestSpec
from nitsum.sampling import SamplingParams
from tiny import hf_greedy, make_tiny, run_arrivals
from tiny import random_prompt as prompt

LONG = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny():
    return make_tiny("llama-gqa")


def engine_for(tiny, **kw):
    hf, cfg = tiny
    ecfg = EngineConfig(kv_cache_bytes=1 << 20, page_tokens=4, token_budget=64, **kw)
    return build_engine(cfg, hf.state_dict().items(), ecfg)


def test_a_strict_request_at_a_full_engine_preempts_background_ones(tiny) -> None:
    hf, cfg = tiny
    ps = {r: prompt(cfg, 9 + i, seed=i) for i, r in enumerate(("bg0", "bg1", "strict"))}
    engine = engine_for(tiny, max_batch=2)
    bg = [
        (r, ps[r], RequestSpec(LONG, slo_class="background", tier="background"))
        for r in ("bg0", "bg1")
    ]
    strict = [("strict", ps["strict"], RequestSpec(LONG, slo_class="feasible", tier="strict"))]
    out, first = run_arrivals(engine, {0: bg, 3: strict})
    assert first["strict"] == 3, first  # admitted in the step it arrived
    assert engine.scheduler.preemptions == 1
    for r, p in ps.items():
        assert out[r] == hf_greedy(hf, p, 16), r
    # The newest background request gave way and finished last.
    assert engine.scheduler.num_reclaimable() == engine.pages.num_pages


@pytest.mark.parametrize(
    "newcomer, preempts",
    [
        ({"priority": 0}, True),  # more important within the class
        ({"priority": 5}, False),  # as important: waits its turn
        ({"priority": 0, "may_preempt": False}, False),  # its tier may not preempt
    ],
)
def test_priority_within_a_class(tiny, newcomer: dict, preempts: bool) -> None:
    hf, cfg = tiny
    engine = engine_for(tiny, max_batch=1)
    a, b = prompt(cfg, 10, seed=3), prompt(cfg, 12, seed=4)
    out, first = run_arrivals(
        engine,
        {
            0: [("a", a, RequestSpec(LONG, slo_class="feasible", tier="t", priority=5))],
            2: [("b", b, RequestSpec(LONG, slo_class="feasible", tier="t", **newcomer))],
        },
    )
    assert (first["b"] == 2) == preempts, first
    assert engine.scheduler.preemptions == int(preempts)
    assert out["a"] == hf_greedy(hf, a, 16) and out["b"] == hf_greedy(hf, b, 16)
