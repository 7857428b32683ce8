"""`nitsum bench --trace random`: vLLM's `bench serve` random set as a closed loop, one run per
concurrency, against the fake server of known delays: exact token-id prompts, at most that
many requests in flight, prompts of their own per run, and TTFT / ITL / output tok/s."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nitsum.bench.bench_cli import main
from nitsum.bench.fake_server import FakeOpenAIServer
from nitsum.bench.record import RequestRecord
from nitsum.bench.report import inter_token_gaps, latency_summary

TTFT, TPOT = 0.04, 0.01


def _bench(url: str, out: Path, concurrency: list[str], prompts: list[str]) -> int:
    return main([
        "--url", url, "--trace", "random", "--random-input-len", "24",
        "--random-output-len", "6", "--max-concurrency", *concurrency, "--num-prompts",
        *prompts, "--token-ids", "0:128000", "--out", str(out), "--no-progress",
    ])  # fmt: skip


def test_closed_loop_runs_each_concurrency_with_prompts_of_its_own(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    with FakeOpenAIServer(ttft_s=TTFT, tpot_s=TPOT) as srv:
        assert _bench(srv.url, out, ["1"], ["3"]) == 0
        assert srv.max_in_flight == 1  # a closed loop of one: the next waits for the last
        assert _bench(srv.url, out, ["1", "4"], ["3", "8"]) == 0
        assert srv.max_in_flight == 4
        bodies = [body for _, body in srv.received]
    res = json.loads(out.read_text())
    assert [(r["max_concurrency"], r["summary"]["n_ok"]) for r in res["runs"]] == [(1, 3), (4, 8)]
    prompts = [tuple(b["prompt"]) for b in bodies]
    assert {len(p) for p in prompts} == {24} and all(0 <= t < 128000 for p in prompts for t in p)
    assert all(b["max_tokens"] == 6 and b["ignore_eos"] for b in bodies)
    # The second invocation's runs drew prompts unlike each other's; its first run's are
    # the first invocation's (same seed), so only 3 of its 11 repeat.
    assert len(set(prompts[3:])) == 11 and len(set(prompts)) == 11
    for run in res["runs"]:
        s = run["summary"]
        itl, ttft = s["latency"]["itl_ms"], s["latency"]["ttft_ms"]
        # Sleeps bound them from below; the slack absorbs a busy 2-core machine.
        assert TPOT * 1e3 * 0.8 <= itl["p50"] <= TPOT * 1e3 + 40
        assert TTFT * 1e3 * 0.9 <= ttft["p50"] <= TTFT * 1e3 + 150
        assert s["output_tokens_per_s"] == pytest.approx(6 * s["n_ok"] / run["wall_s"])


def test_closed_loop_options_are_refused_where_they_do_not_apply(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--trace", "bursty", "--max-concurrency", "4", "--dry-run"]) == 2
    assert "need --trace random" in capsys.readouterr().err
    argv = ["--trace", "random", "--max-concurrency", "1", "2", "--num-prompts", "1", "2", "3"]
    assert main([*argv, "--dry-run"]) == 2
    assert "one value or one per --max-concurrency value" in capsys.readouterr().err
    assert main(["--trace", "random", "--rate-scale", "2", "--dry-run"]) == 2
    assert "--rate-scale does not apply" in capsys.readouterr().err
    argv = ["--trace", "random", "--max-concurrency", "1", "16", "--num-prompts", "4", "64"]
    assert main([*argv, "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "concurrency 1: 4 requests over 0.0 s, 4096 prompt + 512 output tokens, tiers "
        "{'strict': 4, 'relaxed': 0, 'background': 0}",
        "concurrency 16: 64 requests over 0.0 s, 65536 prompt + 8192 output tokens, tiers "
        "{'strict': 64, 'relaxed': 0, 'background': 0}",
    ]


def test_itl_pools_every_gap_between_tokens_of_every_request() -> None:
    def rec(i: int, times: list[float]) -> RequestRecord:
        r = RequestRecord(i, "t", 8, len(times), 0.0, send_s=0.0, n_out=len(times))
        r.first_token_s, r.last_token_s, r.done_s = times[0], times[-1], times[-1]
        r.chunk_times = times
        return r

    a, b = rec(0, [0.1, 0.2, 0.5]), rec(1, [0.3, 0.31])
    assert inter_token_gaps(a) == pytest.approx([0.1, 0.3])
    lat = latency_summary([a, b])
    # Gaps 100, 300 and 10 ms pooled; TPOT is one mean per request: 200 and 10 ms.
    assert lat["itl_ms"]["p50"] == pytest.approx(100.0)
    assert lat["itl_ms"]["mean"] == pytest.approx(410 / 3)
    assert lat["tpot_ms"]["p50"] == pytest.approx(105.0)
