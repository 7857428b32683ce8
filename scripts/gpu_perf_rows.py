"""The rows of gpu_check.sh's decode and serving sections, judged against issue 38's targets
(docs/gpu.md, "Targets"): decode per batch x prompt against its floor of weights + KV, and
the closed-loop serving load per concurrency (and the bursty load's standing targets)."""

from __future__ import annotations

from gpu_row import Row, SectionRun, ms, wall_once  # scripts/ is on the path

# GPU targets (docs/gpu.md, "Targets"): issue 38's four, each judged on one row.
FLOOR_RATIO_MAX = 1.3  # decode step at batch 1, 1,024-token prompts / its floor (weights + KV)
FLOOR_POINT = (1, 1024)  # (batch, prompt) of that row
DECODE_TOK_S_MIN = 8000.0  # decode tok/s at batch 64, 2,048-token prompts, on an H200
DECODE_POINT = (64, 2048)
SERVE_ITL_P50_MAX_MS = 5.0  # closed-loop serving at concurrency 1: ITL p50
SERVE_C64_TOK_S_MIN = 8000.0  # closed-loop serving at concurrency 64: output tok/s
# The bursty load's (the 2026-11-27 runs').
BURSTY_WALL_MAX_S = 50.0  # 1.25x the 40 s trace
BURSTY_TPOT_P50_MAX_MS = 25.0
BURSTY_TTFT_P50_MAX_MS = 500.0


def decode_rows(run: SectionRun) -> list[Row]:
    """scripts/bench_gpu.py: a row per decode point (BATCHxPROMPT), each against its floor
    (weights + KV at the copy rate) and as % of the copy rate and of the spec bandwidth."""
    d = run.data
    if d is None or not d.get("points"):
        return [run.row("no numbers", "see docs/gpu.md", False, "FAIL")]
    rows = []
    for p in d["points"]:
        point = (p["batch"], p["prompt"])
        gb = (d["weight_bytes"] / 1e9, p["kv_bytes"] / 1e9)
        spec = "-" if p["pct_spec"] is None else f"{p['pct_spec']:.0f}%"
        numbers = (
            f"{p['tok_s']:.0f} tok/s, step {p['step_ms']:.2f} ms vs floor {p['floor_ms']:.2f} ms "
            f"({gb[0]:.2f} GB weights + {gb[1]:.2f} GB KV): {p['floor_ratio']:.2f}x; "
            f"{p['pct_copy']:.0f}% of copy rate ({d['copy_gbps']:.0f} GB/s), {spec} of spec"
        )
        if p.get("host_waited") is not None:  # overlapped: the host's share waiting on the device
            numbers += f"; host waited {p['host_waited']:.0%}"
        target, met = "-", None
        if point == FLOOR_POINT:
            target, met = f"<= {FLOOR_RATIO_MAX}x floor", p["floor_ratio"] <= FLOOR_RATIO_MAX
        elif point == DECODE_POINT:
            target, met = f">= {DECODE_TOK_S_MIN:.0f} tok/s", p["tok_s"] >= DECODE_TOK_S_MIN
        rows.append(run.row(numbers, target, met).named(f"decode b{point[0]} x {point[1]}"))
    return wall_once(rows)


def serve_rows(run: SectionRun) -> list[Row]:
    """`nitsum bench --trace random` (closed loop, vLLM's `bench serve` shape): a row per
    concurrency with TTFT, ITL, TPOT and output tok/s; errors fail the row."""
    d = run.data
    runs = [r for r in (d or {}).get("runs") or [] if "max_concurrency" in r]
    if not runs:
        return [run.row("bench gave no closed-loop results", "see docs/gpu.md", False, "FAIL")]
    rows = []
    for one in runs:
        c, s = one["max_concurrency"], one["summary"]
        lat = s["latency"]
        ttft, itl, tpot = lat["ttft_ms"], lat["itl_ms"], lat["tpot_ms"]
        numbers = (
            f"{s['n_ok']}/{s['n_requests']} ok; TTFT p50 {ms(ttft['p50'])} p99 "
            f"{ms(ttft['p99'])} ms; ITL p50 {ms(itl['p50'], 2)} p99 {ms(itl['p99'], 2)} "
            f"ms; TPOT p50 {ms(tpot['p50'], 2)} ms; {s['output_tokens_per_s']:.0f} output tok/s"
        )
        target, met = "-", None
        if c == 1:
            target = f"ITL p50 <= {SERVE_ITL_P50_MAX_MS} ms"
            met = itl["p50"] is not None and itl["p50"] <= SERVE_ITL_P50_MAX_MS
        elif c == 64:
            target = f">= {SERVE_C64_TOK_S_MIN:.0f} output tok/s"
            met = s["output_tokens_per_s"] >= SERVE_C64_TOK_S_MIN
        errors = s["n_errors"] > 0
        row = run.row(numbers, target, None if met is None else met and not errors,
                      "FAIL" if errors else None)  # fmt: skip
        rows.append(row.named(f"serve c{c}"))
    return wall_once(rows)


def bursty_rows(run: SectionRun) -> list[Row]:
    """The bursty `nitsum bench` load (the 2026-11-26/27 H200 serving runs): wall time for the
    40 s trace, TTFT and TPOT p50, errors."""
    d = run.data
    if d is None or not d.get("runs"):
        return [run.row("bench gave no results", "see docs/gpu.md", False, "FAIL")]
    one = d["runs"][0]
    s, lat = one["summary"], one["summary"]["latency"]
    ttft, tpot = lat["ttft_ms"], lat["tpot_ms"]
    ttft50 = ttft["p50"] if ttft else None
    tpot50 = tpot["p50"] if tpot else None
    numbers = (
        f"wall {one['wall_s']:.1f} s for a {s['duration_s']:.0f} s trace; TTFT p50 "
        f"{ms(ttft50)} ms; TPOT p50 {ms(tpot50)} ms; {s['n_ok']}/{s['n_requests']} ok, "
        f"{s['n_errors']} errors"
    )
    met = (
        one["wall_s"] <= BURSTY_WALL_MAX_S
        and ttft50 is not None
        and ttft50 <= BURSTY_TTFT_P50_MAX_MS
        and tpot50 is not None
        and tpot50 <= BURSTY_TPOT_P50_MAX_MS
        and s["n_errors"] == 0
    )
    target = (
        f"wall <= {BURSTY_WALL_MAX_S:.0f} s, TTFT p50 <= {BURSTY_TTFT_P50_MAX_MS:.0f} ms, "
        f"TPOT p50 <= {BURSTY_TPOT_P50_MAX_MS:.0f} ms, 0 errors"
    )
    result = run.result if s["n_errors"] == 0 else "FAIL"
    return [run.row(numbers, target, met, result)]
