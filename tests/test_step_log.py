"""The step log (`NITSUM_STEP_LOG`, engine/step_log.py) and its summary script: one line per
step with the batch it ran, the queues and the preemptions, as the engine really did them."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from nitsum.engine.build import build_engine
from nitsum.engine.engine_config import EngineConfig
from nitsum.engine.request_spec import RequestSpec
from nitsum.engine.step_log import STEP_LOG_ENV, StepLog
from nitsum.sampling import SamplingParams
from tiny import kv_bytes, make_tiny, random_prompt

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import step_log_summary  # noqa: E402


@pytest.fixture
def step_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "steps.jsonl"
    monkeypatch.setenv(STEP_LOG_ENV, str(path))
    monkeypatch.setattr(StepLog, "_opened", {})
    return path


@pytest.mark.parametrize("overlap", [False, True])
def test_each_step_logs_the_batch_it_ran(step_log: Path, overlap: bool) -> None:
    """Three prompts of 10, 7 and 20 tokens with a 16-token budget, 3 new tokens each: the
    lines add up to exactly the prompt tokens and the decode rows the engine ran, stepped
    synchronously or overlapped (engine/overlap.py: a line per `step` call)."""
    hf, cfg = make_tiny("llama-gqa")
    ecfg = EngineConfig(
        kv_cache_bytes=kv_bytes(cfg, 256), page_tokens=4, token_budget=16, overlap=overlap
    )
    engine = build_engine(cfg, hf.state_dict().items(), ecfg)
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    for i, n in enumerate((10, 7, 20)):
        engine.add_request(f"r{i}", random_prompt(cfg, n, i), RequestSpec(params))
    steps = 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
    assert engine.step_log is not None
    engine.step_log.log.flush()
    lines = [json.loads(t) for t in step_log.read_text().splitlines()]
    assert len(lines) == steps
    assert sum(r["prefill_tokens"] for r in lines) == 10 + 7 + 20
    # The first token of each comes from its last prefill chunk: 2 decode rows each.
    assert sum(r["decode"] for r in lines) == 3 * 2
    assert all(r["prefill_tokens"] + r["decode"] <= 16 for r in lines)
    assert lines[0]["gap_ms"] is None and all(r["gap_ms"] >= 0 for r in lines[1:])
    assert lines[0]["prefill_tokens"] == 16 and lines[0]["waiting"] >= 1
    assert lines[-1]["running"] == 0 and sum(r["preempted"] for r in lines) == 0
    assert {r["pid"] for r in lines} == {os.getpid()}
    if overlap:
        # Each call applies the batch launched by the call before: the same work, one late.
        assert sum(r["applied_prefill_tokens"] for r in lines) == 10 + 7 + 20
        assert sum(r["applied_decode"] for r in lines) == 3 * 2
        assert lines[0]["applied_prefill_tokens"] == 0  # nothing launched before the first
    else:
        assert not any("applied_decode" in r for r in lines)

    report = step_log_summary.summary(step_log_summary.load(step_log), 1.0, None)
    assert report[0].startswith(f"{steps} steps")
    assert "prefill tokens 37, decode rows 6, preemptions 0" in report[1]


def test_the_fit_recovers_known_costs() -> None:
    """Steps made up as 2 ms + 30 us a decode row + 20 us a prefill token: the fit says so."""
    rows = [
        {"rows": d + (p > 0), "decode": d, "prefill_tokens": p, "ms": 2 + 0.03 * d + 0.02 * p}
        for d in (1, 8, 64, 200)
        for p in (0, 512, 4096)
    ]
    fit = step_log_summary.fit(rows)
    assert fit is not None
    a, b, c = fit
    assert a == pytest.approx(2.0) and b == pytest.approx(0.03) and c == pytest.approx(0.02)


def test_the_summary_reads_the_busiest_process_and_the_applied_batch() -> None:
    """Lines of two worker processes: the summary takes the one with more lines; an
    overlapped line's time is fitted on the batch it applied, not the one it scheduled."""
    base = dict(gap_ms=0.0, running=1, waiting=0, free_pages=9, preempted=0, waited_ms=1.0)
    rows = [
        {
            **base,
            "t": 0.01 * i,
            "pid": 7,
            "engine": 0,
            "rows": 1,
            "decode": 0,
            "prefill_rows": 1,
            "prefill_tokens": 999,
            "applied_decode": d,
            "applied_prefill_tokens": p,
            "ms": 2 + 0.03 * d + 0.02 * p,
        }
        for i, (d, p) in enumerate((d, p) for d in (1, 8, 64) for p in (0, 512, 4096))
    ]
    other = [{**rows[0], "pid": 8}]
    report = step_log_summary.summary(rows + other, 1.0, None)
    assert report[0] == "2 processes wrote this log; process 7 alone below"
    assert report[1].startswith("9 steps")
    assert "step ms = 2.00 + 30.0 us/decode row + 20.00 us/prefill token" in report[-1]
