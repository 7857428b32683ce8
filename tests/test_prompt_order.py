"""Long prompts do not block short ones (issue 11): short prompts overtake a long one that
can spare the tokens, on the pure ordering rule and in the engine with one 8k-token prompt."""

import time

import pytest
import torch

from nitsum.engine.build import build_engine
from nitsum.engine.engine_config import EngineConfig
from nitsum.engine.prompt_order import deadline_spare, overtaking_order
from nitsum.engine.request_spec import RequestSpec
from nitsum.sampling import SamplingParams
from tiny import hf_greedy, make_tiny

SHORT = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
LONG_TOKENS = 8000
BUDGET = 512


def order(items: list[tuple[str, int]], spare: dict[str, int], short_max: int = 4) -> list[str]:
    """`overtaking_order` over (name, remaining) pairs with a fixed spare per long prompt."""
    left = dict(items)
    got = overtaking_order(
        [n for n, _ in items], lambda n: left[n], lambda n, ahead: spare[n], short_max
    )
    return got


def test_shorts_overtake_within_what_the_long_prompts_spare() -> None:
    # L spares 6: s1 (3) and s2 (3) go first, s3 does not fit and stops the overtaking, so
    # s4 keeps its place behind it; a short before L stays where it is.
    items = [("a", 2), ("L", 100), ("s1", 3), ("s2", 3), ("s3", 2), ("s4", 1)]
    assert order(items, {"L": 6}) == ["s1", "s2", "a", "L", "s3", "s4"]
    # A second long prompt's smaller spare bounds what overtakes both (s2 does not fit M's
    # 1 token, and s3 stays behind s2).
    items = [("L", 100), ("s1", 2), ("M", 50), ("s2", 3), ("s3", 1)]
    assert order(items, {"L": 9, "M": 1}) == ["s1", "L", "M", "s2", "s3"]
    assert order(items, {"L": 9, "M": 4}) == ["s1", "s2", "s3", "L", "M"]
    # Nothing spare: first come, first served.
    assert order([("L", 9), ("s", 1)], {"L": 0}) == ["L", "s"]


def test_deadline_spare_keeps_the_long_prompt_in_time() -> None:
    # 10 s left at 1 s a step of 100 tokens: 1000 tokens fit; 300 ahead, 500 its own.
    assert deadline_spare(0.0, 10.0, 1.0, 100, ahead=300, left=500) == 200
    assert deadline_spare(0.0, 10.0, 1.0, 100, ahead=600, left=500) == 0
    assert deadline_spare(0.0, 9.99, 1.0, 100, ahead=0, left=850) == 50


@pytest.fixture(scope="module")
def tiny_long():
    return make_tiny("llama-long")


def engine_for(tiny_long):
    hf, cfg = tiny_long
    ecfg = EngineConfig(kv_cache_bytes=16 << 20, page_tokens=16, token_budget=BUDGET)
    return build_engine(cfg, hf.state_dict().items(), ecfg)


def prompts(cfg, n: int) -> tuple[list[int], list[list[int]]]:
    g = torch.Generator().manual_seed(5)
    long = torch.randint(0, cfg.vocab_size, (LONG_TOKENS,), generator=g).tolist()
    shorts = [torch.randint(0, cfg.vocab_size, (20 + i,), generator=g).tolist() for i in range(n)]
    return long, shorts


def run_out(engine, max_steps: int = 200) -> tuple[dict[str, int], dict[str, list[int]]]:
    """Step to the end: the step each request got its first token at, and its tokens."""
    first: dict[str, int] = {}
    outs: dict[str, list[int]] = {}
    for step in range(1, max_steps + 1):
        if not engine.has_unfinished():
            return first, outs
        for o in engine.step():
            outs.setdefault(o.request_id, []).extend(o.new_token_ids)
            if o.new_token_ids:
                first.setdefault(o.request_id, step)
    raise AssertionError(f"unfinished after {max_steps} steps: {first}")


@pytest.mark.slow  # an 8k-token prompt through an engine: 10-16 s each on 2 cores
@pytest.mark.parametrize("slo_class", ["background", "no-ttft"])
def test_an_8k_prompt_without_a_deadline_does_not_block_short_ones(tiny_long, slo_class) -> None:
    """One worker, one 8000-token prompt (16 budgets of 512) already prefilling, then four
    short prompts: they get their first tokens within two steps (under FCFS: after the 15
    steps the long one still needs), with the reference tokens; the long one keeps at least
    half of each step (done within 2x its 16 steps) and its output is exact too."""
    hf, cfg = tiny_long
    engine = engine_for(tiny_long)
    long, shorts = prompts(cfg, 4)
    tier = ("background", "background") if slo_class == "background" else ("feasible", "relaxed")
    spec = RequestSpec(SHORT, slo_class=tier[0], tier=tier[1])
    engine.add_request("long", long, spec)  # no ttft_ms: no deadline
    engine.step()
    assert engine.seqs["long"].num_computed == BUDGET
    for i, p in enumerate(shorts):
        engine.add_request(f"s{i}", p, spec)
    steps, outs = run_out(engine)
    assert max(steps[f"s{i}"] for i in range(4)) <= 2, steps
    assert steps["long"] <= 2 * LONG_TOKENS // BUDGET, steps
    for i, p in enumerate(shorts):
        assert outs[f"s{i}"] == hf_greedy(hf, p, 4), i
    assert outs["long"] == hf_greedy(hf, long, 4)


@pytest.mark.slow
def test_a_long_prompt_with_slack_lets_short_ones_by_but_one_without_does_not(tiny_long) -> None:
    """With a TTFT deadline the long prompt spares only what keeps it in time at the slowest
    recent step (assumed 0.5 s): with a minute of slack the shorts share its next step; with
    7.4 s, less than the 15 steps it still needs at that pace, nothing is spare and the whole
    step is its own. Either way every output is the reference."""
    hf, cfg = tiny_long
    long, shorts = prompts(cfg, 2)
    strict = RequestSpec(SHORT, slo_class="feasible", tier="strict", ttft_ms=60_000.0)
    for slack, shorts_first in ((60.0, True), (7.4, False)):
        engine = engine_for(tiny_long)
        engine.add_request("long", long, strict)
        engine.step()
        engine.scheduler.full_steps.clear()
        engine.scheduler.full_steps.append(0.5)
        engine.seqs["long"].deadline = time.monotonic() + slack
        for i, p in enumerate(shorts):
            engine.add_request(f"s{i}", p, strict)
        batch = engine.scheduler.schedule()
        shares = {s.seq.request_id: s.q_len for s in batch}
        if shorts_first:
            assert shares == {"s0": 20, "s1": 21, "long": BUDGET - 41}, shares
        else:
            assert shares == {"long": BUDGET}, shares
        outs = run_out_after(engine, batch)
        assert outs["long"] == hf_greedy(hf, long, 4), slack
        for i, p in enumerate(shorts):
            assert outs[f"s{i}"] == hf_greedy(hf, p, 4), (slack, i)


def run_out_after(engine, batch) -> dict[str, list[int]]:
    """Run the scheduled `batch`, then step to the end; every request's tokens."""
    outs: dict[str, list[int]] = {}
    for o in engine.complete_step(batch, engine.runner.run(batch)):
        outs.setdefault(o.request_id, []).extend(o.new_token_ids)
    for rid, ids in run_out(engine)[1].items():
        outs.setdefault(rid, []).extend(ids)
    return outs
