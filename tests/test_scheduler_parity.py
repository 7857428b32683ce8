"""The worker's local scheduler (engine/scheduler.py + prompt_order.py) and its simulator twin
(scheduler-rs/src/sim/group/ + prompt_order.rs) schedule the same scenarios the same way:
each golden trace of tests/golden/scheduler/ is checked here against the worker's scheduler
and by `cargo test parity` against the simulator's, so either side drifting fails one of them."""

from __future__ import annotations

from pathlib import Path

import pytest

import scheduler_parity as parity


@pytest.mark.parametrize("path", parity.scenarios(), ids=lambda p: p.stem)
def test_the_local_scheduler_follows_the_golden_trace(path: Path) -> None:
    assert parity.run(parity.load(path)) == parity.golden_trace(path)


def test_the_scenarios_cover_what_both_schedulers_must_agree_on() -> None:
    """Arrivals, every class, a long prompt overtaken by short ones, decodes beside
    prompts, and priority preemption (of a decoding request, which resumes without
    recomputing: the simulator keeps its KV, the worker finds it in the prefix cache)."""
    traces = {p.stem: "\n".join(parity.golden_trace(p)) for p in parity.scenarios()}
    assert len(traces) >= 3
    everything = "\n".join(traces.values())
    scenarios = [parity.load(p) for p in parity.scenarios()]
    classes = {r["class"] for s in scenarios for r in s.requests}
    assert classes == {"feasible", "best_effort", "background"}
    assert any(r["prompt"] > 2 * s.budget for s in scenarios for r in s.requests)
    assert any(len({r["arrival_step"] for r in s.requests}) > 2 for s in scenarios)
    # A long prompt that does not get the first tokens of a step (shorts went first)...
    lines = traces["long_prompt"].splitlines()
    assert "prefill long:11 s1:5" in lines[0]
    # ...and decodes sharing steps with prompts.
    assert any(
        "prefill -" not in line and "decode -" not in line for line in everything.split("\n")
    )


def test_preempted_requests_resume_and_finish_with_every_token() -> None:
    """In the preemption scenario each request decodes `output - 1` times after its first
    token, whatever was preempted in between (nothing is lost or done twice)."""
    path = parity.GOLDEN / "preemption.json"
    scenario = parity.load(path)
    trace = parity.golden_trace(path)
    decodes = {r["id"]: 0 for r in scenario.requests}
    for line in trace:
        names = line.split("; decode ")[1].split(";")[0].split()
        for name in names:
            if name != "-":
                decodes[name] += 1
    assert decodes == {r["id"]: r["output"] - 1 for r in scenario.requests}
    # bg0 and bg1 decode alone, stop while the feasible and best-effort requests run, and
    # come back after them.
    assert trace[3].startswith("step 3: prefill f0:8; decode bg0;")
    assert trace[6].startswith("step 6: prefill -; decode bg0 bg1;")
