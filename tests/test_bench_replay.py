"""Replay against an in-process fake OpenAI streaming server with known delays, and the CLI."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from nitsum.bench.bench_cli import main
from nitsum.bench.fake_server import FakeOpenAIServer
from nitsum.bench.planlog import load_plan_log
from nitsum.bench.replay import (
    ReplayConfig,
    build_request,
    completions_url,
    make_prompt,
    run_replay,
)
from nitsum.bench.traces import TraceRequest

TTFT, TPOT = 0.05, 0.02
# NOTE: sleeps guarantee the lower bounds; the upper slack absorbs a busy 2-core machine.
SLACK = 0.15


def test_replay_measures_ttft_tpot_and_sends_what_the_trace_says() -> None:
    reqs = [TraceRequest(0.05 * i, 7 + i, 5, "strict" if i % 2 else "relaxed") for i in range(6)]
    with FakeOpenAIServer(ttft_s=TTFT, tpot_s=TPOT) as srv:
        cfg = ReplayConfig(completions_url(srv.url), model="m", api_key="sk-1", seed=4)
        t = time.perf_counter()
        res = run_replay(reqs, cfg)
        assert time.perf_counter() - t < 5.0
        received = sorted(srv.received, key=lambda hb: len(hb[1]["prompt"]))
    assert len(res.records) == 6 and all(r.ok for r in res.records), res.records
    for r in res.records:
        assert r.n_out == 5 and len(r.chunk_times) == 5
        assert TTFT <= r.ttft_s <= TTFT + SLACK
        # Chunks are TPOT apart on the server; the first could be delayed on the way, so the
        # mean interval may come out slightly under TPOT.
        assert TPOT - 0.005 <= r.tpot_s <= TPOT + SLACK / 4
        assert r.e2e_s >= TTFT + 4 * TPOT - 0.005
        assert 0 <= r.send_s - r.scheduled_s < 0.2
    for i, (headers, body) in enumerate(received):
        assert body["prompt"] == make_prompt(i, 7 + i, 4, (1000, 20000))
        assert all(1000 <= x < 20000 for x in body["prompt"])
        assert body["max_tokens"] == 5 and body["stream"] and body["ignore_eos"]
        assert body["stream_options"] == {"include_usage": True} and body["model"] == "m"
        assert headers["x-nitsum-tier"] == ("strict" if i % 2 else "relaxed")
        assert headers["Authorization"] == "Bearer sk-1"


def test_without_usage_counts_token_chunks() -> None:
    with FakeOpenAIServer(ttft_s=0.0, tpot_s=0.0, usage=False) as srv:
        res = run_replay([TraceRequest(0.0, 3, 4)], ReplayConfig(completions_url(srv.url)))
    (r,) = res.records
    assert r.ok and r.n_out == 4


def test_errors_and_timeouts_fail_the_request_not_the_run() -> None:
    reqs = [TraceRequest(0.0, 3, 2, t) for t in ("ok", "hang", "bad", "junk")]
    with FakeOpenAIServer(
        ttft_s=0.01,
        tpot_s=0.01,
        hang_tiers=frozenset({"hang"}),
        fail_tiers=frozenset({"bad"}),
        garbage_tiers=frozenset({"junk"}),
    ) as srv:
        t = time.perf_counter()
        res = run_replay(reqs, ReplayConfig(completions_url(srv.url), request_timeout_s=0.5))
        wall = time.perf_counter() - t
    ok, hang, bad, junk = res.records
    assert ok.ok and ok.n_out == 2
    assert hang.error == "timeout after 0.5 s" and hang.ttft_s is None
    assert bad.error is not None and bad.error.startswith("HTTP 503")
    assert junk.error is not None and junk.error.startswith("JSONDecodeError")
    assert not junk.ok and junk.first_token_s is not None  # a token came, then garbage
    assert 0.5 <= wall < 3.0


def test_global_deadline_ends_the_run_with_a_record_per_request() -> None:
    reqs = [TraceRequest(0.0, 3, 2, "hang"), TraceRequest(1.0, 3, 2, "ok")]
    done: list[int] = []
    with FakeOpenAIServer(hang_tiers=frozenset({"hang"})) as srv:
        cfg = ReplayConfig(completions_url(srv.url), deadline_s=0.3, request_timeout_s=60)
        t = time.perf_counter()
        res = run_replay(reqs, cfg, on_done=lambda r: done.append(r.index))
        wall = time.perf_counter() - t
    assert res.records[0].error == "cancelled: global deadline 0.3 s"
    assert res.records[1].error == "not sent: global deadline 0.3 s"
    assert res.records[1].send_s is None
    assert sorted(done) == [0, 1]
    assert 0.3 <= wall < 1.5


def test_concurrency_cap_bounds_in_flight_requests() -> None:
    reqs = [TraceRequest(0.0, 2, 3) for _ in range(6)]
    with FakeOpenAIServer(ttft_s=0.05, tpot_s=0.01) as srv:
        res = run_replay(reqs, ReplayConfig(completions_url(srv.url), concurrency=2))
        assert srv.max_in_flight == 2
    assert all(r.ok for r in res.records)
    # Three waves of two: the last wave is sent after two full requests (>= 2 × 70 ms).
    assert max(r.send_s - r.scheduled_s for r in res.records) >= 2 * (0.05 + 2 * 0.01) - 0.01


def test_unreachable_server_fails_every_request_quickly() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again before use: nothing listens there
    t = time.perf_counter()
    res = run_replay(
        [TraceRequest(0.0, 2, 2), TraceRequest(0.1, 2, 2)],
        ReplayConfig(f"http://127.0.0.1:{port}/v1/completions", connect_timeout_s=1.0),
    )
    assert all(r.error and r.error.startswith("ConnectError") for r in res.records)
    assert time.perf_counter() - t < 3.0


def test_plan_polling_records_a_timeline() -> None:
    with FakeOpenAIServer(ttft_s=0.3, tpot_s=0.1) as srv:
        cfg = ReplayConfig(
            completions_url(srv.url), plan_url=srv.url + "/admin/plan", plan_interval_s=0.1
        )
        res = run_replay([TraceRequest(0.0, 2, 3)], cfg)
    assert res.records[0].ok
    # The run lasts >= 0.5 s, so >= 5 polls; the fake's epoch advances every other poll.
    assert len(res.plan_log) >= 5
    assert [e["epoch"] for e in res.plan_log[:4]] == [0, 1, 1, 2]
    assert res.plan_log[1]["groups"][0]["tp"] == 2
    assert all(a["t"] < b["t"] for a, b in zip(res.plan_log, res.plan_log[1:], strict=False))


def test_request_body_and_urls() -> None:
    cfg = ReplayConfig("u", token_id_range=(5, 6))
    body, headers = build_request(0, TraceRequest(0.0, 3, 9), cfg)
    assert body["prompt"] == [5, 5, 5] and "model" not in body and headers == {}
    assert completions_url("http://h:1/") == "http://h:1/v1/completions"
    assert completions_url("http://h:1/v1") == "http://h:1/v1/completions"
    assert completions_url("http://h:1/v1/completions") == "http://h:1/v1/completions"


# --- CLI ---------------------------------------------------------------------------------


def test_cli_sweep_writes_results_plan_and_plots(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    rows = [{"timestamp": 0.1 * i, "input_length": 50, "output_length": 3} for i in range(4)]
    trace.write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "r.json"
    with FakeOpenAIServer(ttft_s=0.01, tpot_s=0.01) as srv:
        argv = [
            "--url", srv.url, "--trace", str(trace), "--max-context", "40",
            "--tiers", "s:ttft=1000,tpot=500", "--tiers", "bg:background",
            "--tier-mix", "s=1,bg=1", "--rate-scale", "1", "2", "--out", str(out),
            "--plot", str(tmp_path / "g.png"), "--plan-url", srv.url + "/admin/plan",
            "--plot-plan", str(tmp_path / "p.png"), "--no-progress",
        ]  # fmt: skip
        assert main(argv) == 0
        prompt_lens = {len(body["prompt"]) for _, body in srv.received}
    assert prompt_lens == {37}  # 50 clamped so 37 + 3 fits the 40-token context
    res = json.loads(out.read_text())
    assert res["model"] == "fake-model"
    assert [r["rate_scale"] for r in res["runs"]] == [1.0, 2.0]
    # 4 requests over the trace's last arrival, 0.3 s, then 0.15 s; half background.
    s1, s2 = (r["summary"] for r in res["runs"])
    assert s1["duration_s"] == pytest.approx(0.3) and s2["duration_s"] == pytest.approx(0.15)
    assert (s1["n_ok"], s1["n_good"], s1["tiers"]["bg"]["n"]) == (4, 2, 2)
    assert s2["goodput"] == pytest.approx(2 / 0.15)
    assert len(res["runs"][0]["records"]) == 4
    assert Path(res["runs"][0]["plan_log"]).exists()
    # Plot-only modes reuse what the sweep saved.
    plan_log = res["runs"][0]["plan_log"]
    assert load_plan_log(plan_log)[0]["groups"][0]["members"] == [0]
    assert main(["--compare", str(out), str(out), "--plot", str(tmp_path / "c.png")]) == 0
    assert main(["--plan-log", plan_log, "--plot-plan", str(tmp_path / "t.png")]) == 0
    for png in ("g.png", "p-x1.png", "p-x2.png", "c.png", "t.png"):
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"


def test_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--trace", "bursty", "--bursty-duration", "10", "--dry-run"]) == 0
    assert "requests over 10.0 s" in capsys.readouterr().out
    assert main(["--trace", "bursty", "--tier-mix", "gold=1", "--dry-run"]) == 2
    assert "not in the tiers spec" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 1, "output_length": 1}\n{oops\n')
    assert main(["--trace", str(bad), "--dry-run"]) == 2
    assert "bad.jsonl:2: invalid JSON" in capsys.readouterr().err
    assert main(["--trace", "bursty", "--dry-run", "--rate-scale", "0"]) == 2
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    argv = ["--url", dead, "--trace", "bursty", "--max-requests", "2", "--no-progress"]
    assert main(argv) == 1  # nothing succeeded: the server is not there
    assert "errors 2" in capsys.readouterr().out
