"""Goodput, attainment and percentiles on hand-made timings; plot data preparation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nitsum.bench.plot import Segment, goodput_points, plan_segments, plot_goodput_vs_rate
from nitsum.bench.record import RequestRecord
from nitsum.bench.report import meets_slo, percentile, summarize
from nitsum.bench.tiers import TierSpec, parse_tier_arg

STRICT = TierSpec("strict", ttft_ms=100, tpot_ms=20)
RELAXED = TierSpec("relaxed", ttft_ms=500, tpot_ms=50)
BG = parse_tier_arg("bg:background")
TIERS = [STRICT, RELAXED, BG]


def rec(
    i: int,
    tier: str,
    send: float | None,
    first: float | None = None,
    n_out: int = 0,
    last: float | None = None,
    done: float | None = None,
    error: str | None = None,
    scheduled: float | None = None,
) -> RequestRecord:
    sched = send if scheduled is None else scheduled
    return RequestRecord(
        index=i,
        tier=tier,
        input_len=10,
        output_len=max(n_out, 1),
        scheduled_s=sched if sched is not None else float(i),
        send_s=send,
        first_token_s=first,
        last_token_s=last,
        done_s=done,
        n_out=n_out,
        error=error,
    )


# TTFT / TPOT / E2E of each record are in the comments; times are binary-friendly so that the
# inclusive SLO boundary (r5: TTFT exactly 500 ms) is exact.
RECORDS = [
    rec(0, "strict", 0.0, 0.05, 10, 0.14, 0.15),  # 50 ms, 10 ms, 0.15 s → good
    rec(1, "strict", 1.0, 1.2, 5, 1.24, 1.25, scheduled=0.9),  # 200 ms → TTFT miss
    rec(2, "strict", 2.0, 2.08, 3, 2.14, 2.15),  # 80 ms, 30 ms → TPOT miss
    rec(3, "relaxed", 3.0, 3.4, 1, 3.4, 3.4),  # 400 ms, TPOT 0 (one token) → good
    rec(4, "relaxed", 4.0, error="HTTP 503: overloaded"),  # error → miss
    rec(5, "relaxed", 5.0, 5.5, 2, 5.52, 5.52),  # 500 ms (boundary), 20 ms → good
    rec(6, "bg", 6.0, 7.0, 4, 7.3, 7.3),  # 1000 ms, 100 ms, 1.3 s; background
    rec(7, "bg", None, error="not sent: global deadline 9 s"),
]


def test_percentile_is_numpy_linear() -> None:
    assert percentile([1, 2, 3, 4], 25) == 1.75
    assert percentile([4, 1, 3, 2], 50) == 2.5
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None


def test_record_latencies() -> None:
    r0, r3 = RECORDS[0], RECORDS[3]
    assert r0.ttft_s == pytest.approx(0.05)
    assert r0.tpot_s == pytest.approx(0.01)  # (0.14 − 0.05) / 9
    assert r0.e2e_s == pytest.approx(0.15)
    assert r3.tpot_s == 0.0
    assert RECORDS[4].ttft_s is None and RECORDS[4].tpot_s is None and not RECORDS[4].ok
    back = RequestRecord.from_json(json.loads(json.dumps(r0.to_json())))
    assert back.tpot_s == r0.tpot_s and back.ttft_s == r0.ttft_s


def test_meets_slo_both_targets_inclusive() -> None:
    assert [meets_slo(r, STRICT) for r in RECORDS[:3]] == [True, False, False]
    assert [meets_slo(r, RELAXED) for r in RECORDS[3:6]] == [True, False, True]
    assert not meets_slo(RECORDS[6], BG)  # background never counts as good


def test_summary_goodput_attainment_and_percentiles() -> None:
    s = summarize(RECORDS, TIERS, duration_s=10.0)
    assert (s["n_requests"], s["n_ok"], s["n_errors"], s["n_good"]) == (8, 6, 2, 3)
    assert s["goodput"] == pytest.approx(0.3)  # r0, r3, r5 over 10 s
    assert s["request_rate"] == pytest.approx(0.8)
    assert s["slo_request_rate"] == pytest.approx(0.6)
    assert s["slo_attainment"] == pytest.approx(3 / 6)  # background excluded
    assert s["completion_rate"] == pytest.approx(6 / 8)  # background included
    assert s["output_tokens_per_s"] == pytest.approx((10 + 5 + 3 + 1 + 2 + 4) / 10)
    assert s["errors"] == {"HTTP 503": 1, "not sent": 1}
    assert s["send_lag_s"]["max"] == pytest.approx(0.1)

    # Completed TTFTs (ms): 50, 80, 200, 400, 500, 1000.
    ttft = s["latency"]["ttft_ms"]
    assert ttft["p50"] == pytest.approx(300.0)  # rank 2.5: 200 + 0.5·200
    assert ttft["p90"] == pytest.approx(750.0)  # rank 4.5: 500 + 0.5·500
    assert ttft["p99"] == pytest.approx(975.0)  # rank 4.95
    assert ttft["mean"] == pytest.approx(2230 / 6)
    # TPOTs (ms): 0, 10, 10, 20, 30, 100.
    tpot = s["latency"]["tpot_ms"]
    assert (tpot["p50"], tpot["p90"], tpot["p99"]) == pytest.approx((15.0, 65.0, 96.5))
    # E2E (s): 0.15, 0.15, 0.25, 0.4, 0.52, 1.3.
    assert s["latency"]["e2e_s"]["p50"] == pytest.approx(0.325)

    st, rl, bg = s["tiers"]["strict"], s["tiers"]["relaxed"], s["tiers"]["bg"]
    assert (st["n"], st["n_ok"], st["n_good"]) == (3, 3, 1)
    assert st["attainment"] == pytest.approx(1 / 3) and st["goodput"] == pytest.approx(0.1)
    assert st["latency"]["ttft_ms"]["p50"] == pytest.approx(80.0)
    assert (rl["n"], rl["n_ok"], rl["n_good"]) == (3, 2, 2)
    assert rl["attainment"] == pytest.approx(2 / 3) and rl["goodput"] == pytest.approx(0.2)
    assert (bg["n"], bg["n_ok"], bg["n_good"], bg["attainment"], bg["goodput"]) == (
        2,
        1,
        None,
        None,
        None,
    )
    assert bg["latency"]["tpot_ms"]["p50"] == pytest.approx(100.0)
    json.dumps(s, allow_nan=False)  # the summary is strict JSON


def test_summary_rejects_unknown_tier_and_zero_duration() -> None:
    with pytest.raises(ValueError, match="tier 'gold'"):
        summarize([rec(0, "gold", 0.0)], TIERS, 1.0)
    with pytest.raises(ValueError, match="duration_s"):
        summarize(RECORDS, TIERS, 0.0)


def test_summary_of_all_failed_run() -> None:
    s = summarize([rec(0, "strict", 0.0, error="timeout after 1 s")], TIERS, 2.0)
    assert (s["goodput"], s["slo_attainment"], s["n_ok"]) == (0.0, 0.0, 0)
    assert s["latency"]["ttft_ms"]["p99"] is None


# --- plots -------------------------------------------------------------------------------


def test_plan_segments_merge_and_split() -> None:
    both = {"members": [0, 1], "tp": 2, "role": "mixed", "tiers": []}
    pre = {"members": [0], "tp": 1, "role": "prefill", "tiers": []}
    dec = {"members": [1], "tp": 1, "role": "decode", "tiers": []}
    log = [
        {"t": 0.0, "epoch": 1, "groups": [both]},
        {"t": 1.0, "epoch": 1, "groups": [both]},
        {"t": 2.0, "epoch": 2, "groups": [pre, dec]},
        {"t": 3.0, "epoch": 3, "groups": [pre]},  # device 1 left the plan
    ]
    assert plan_segments(log) == [  # the last sample holds for the median gap, 1 s
        Segment(0, 0.0, 2.0, 2, "mixed"),
        Segment(0, 2.0, 4.0, 1, "prefill"),
        Segment(1, 0.0, 2.0, 2, "mixed"),
        Segment(1, 2.0, 3.0, 1, "decode"),
    ]
    assert plan_segments([]) == []


def test_goodput_plot_points_and_file(tmp_path: Path) -> None:
    def run(rate: float, good: float) -> dict:
        tiers = {"strict": {"goodput": good / 2}}
        summary = {"request_rate": rate, "slo_request_rate": rate, "goodput": good, "tiers": tiers}
        return {"summary": summary}

    res = {"label": "nitsum", "runs": [run(4.0, 3.0), run(2.0, 2.0)]}
    assert goodput_points(res) == [(2.0, 2.0), (4.0, 3.0)]
    assert goodput_points(res, tier="strict") == [(2.0, 1.0), (4.0, 1.5)]
    f = tmp_path / "a.json"
    f.write_text(json.dumps(res))
    out = tmp_path / "g.png"
    plot_goodput_vs_rate([f, res], out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
