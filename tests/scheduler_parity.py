"""Runs a scheduler scenario (tests/golden/scheduler/*.json) through the worker's local
scheduler (`engine/scheduler.py`) with no model, and writes the step trace that the
simulator's twin (scheduler-rs/src/sim/parity_tests.rs) must write too.

A scenario: `budget` (prompt tokens per step), `max_batch`, and `requests`, each
`{id, arrival_step, class, prompt, output}`. Arrivals of step k are queued before step k is
scheduled. The trace has one line per step:

    step K: prefill ID:TOKENS ...; decode ID ...; first ID ...; finished ID ...

requests listed in scenario order, `-` for none. What the trace leaves out, and why the two
schedulers agree only on scenarios of a certain shape, is in tests/golden/scheduler/README.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from nitsum.engine.request_spec import RequestSpec
from nitsum.engine.scheduler import Scheduler
from nitsum.engine.sequence import Sequence
from nitsum.kv.pages import PageAllocator
from nitsum.sampling import SamplingParams

GOLDEN = Path(__file__).resolve().parent / "golden" / "scheduler"

# NOTE: one token per page and pages to spare: the prefix cache then keeps every token a
# preempted sequence computed, so a recompute redoes nothing (the simulator's preempted
# requests keep their progress), and pages never run out (the simulator has no KV memory).
PAGE_TOKENS = 1
NUM_PAGES = 4096
# Arrival times: the step, plus this much per place in the scenario, so "newest" (the
# preemption victim) is never a tie.
ARRIVAL_TIE = 1e-3


@dataclass
class Scenario:
    """A scenario file, parsed."""

    name: str
    budget: int
    max_batch: int
    requests: list[dict]
    max_steps: int


def load(path: Path) -> Scenario:
    raw = json.loads(path.read_text())
    return Scenario(
        path.stem, raw["budget"], raw["max_batch"], raw["requests"], raw.get("max_steps", 200)
    )


def scenarios() -> list[Path]:
    return sorted(GOLDEN.glob("*.json"))


def golden_trace(path: Path) -> list[str]:
    return path.with_suffix(".trace").read_text().splitlines()


def _line(step: int, parts: dict[str, list[str]]) -> str:
    body = "; ".join(f"{k} {' '.join(v) if v else '-'}" for k, v in parts.items())
    return f"step {step}: {body}"


def run(scenario: Scenario) -> list[str]:
    """The step trace of `scenario` through the worker's scheduler."""
    pages = PageAllocator(1, NUM_PAGES, PAGE_TOKENS, num_kv_heads=1).group((0,), 1)
    sched = Scheduler(
        pages, max_batch=scenario.max_batch, token_budget=scenario.budget, overtaking=True
    )
    order = {r["id"]: i for i, r in enumerate(scenario.requests)}
    outputs = {r["id"]: r["output"] for r in scenario.requests}
    trace: list[str] = []
    done = 0
    for step in range(scenario.max_steps):
        for i, r in enumerate(scenario.requests):
            if r["arrival_step"] == step:
                # Distinct token ids per request: no prefix is shared between requests.
                seq = Sequence(
                    r["id"],
                    [1000 * (i + 1) + t for t in range(r["prompt"])],
                    RequestSpec(
                        SamplingParams(max_tokens=r["output"], ignore_eos=True),
                        slo_class=r["class"],
                    ),
                    arrival=step + ARRIVAL_TIE * i,
                )
                sched.add(seq)
        batch = sched.schedule()
        chunks: dict[str, int] = {}
        decodes, first, finished = [], [], []
        for item in batch:
            seq = item.seq
            if item.start < len(seq.prompt_ids):
                chunks[seq.request_id] = item.q_len
            else:
                decodes.append(seq.request_id)
            seq.num_computed = item.start + item.q_len
            if not item.sample:
                continue
            if not seq.output_ids:
                first.append(seq.request_id)
            seq.output_ids.append(7)
            if len(seq.output_ids) >= outputs[seq.request_id]:
                finished.append(seq.request_id)
                sched.remove(seq.request_id)
        sched.step_done(batch, 0.01)
        done += len(finished)
        parts = {
            "prefill": [f"{r}:{chunks[r]}" for r in sorted(chunks, key=order.__getitem__)],
            "decode": sorted(decodes, key=order.__getitem__),
            "first": sorted(first, key=order.__getitem__),
            "finished": sorted(finished, key=order.__getitem__),
        }
        if batch:
            trace.append(_line(step, parts))
        if done == len(scenario.requests):
            break
    return trace
