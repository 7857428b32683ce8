"""The rows and the table of scripts/gpu_check.sh: each section's output judged against its
target.

    gpu_table.py row SECTION --rc RC --wall S --budget S --log LOG [--json F] [--device D]
        appends the section's rows (JSON lines) to stdout;
    gpu_table.py table ROWS.jsonl
        prints the markdown table of every row.

A row: section, result (PASS / FAIL / TIMEOUT / MISSING), key numbers, target, verdict
(pass / FAIL against the target; `n/a` on a CPU dry run, whose timings mean nothing, or
where no target applies). NOTE: a section's result is its own exit status (and that its
numbers could be read); the verdict is the numbers against the GPU targets (docs/gpu.md).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

# GPU targets (docs/gpu.md, "Targets").
FLOOR_RATIO_MAX = 1.3  # batch-1 decode step / weight-read floor
DECODE_B64_MIN = 7578.0  # tok/s at batch 64: 2.5x the 3,031 of 2026-11-26 on H200
ATTENTION_COPY_PCT_MIN = 60.0  # decode attention, batch 16, 8k context
PREFILL_GEMM_FRACTION_MIN = 0.5  # prefill rate / bf16 GEMM rate
SERVE_WALL_MAX_S = 50.0  # 1.25x the 40 s trace
SERVE_TPOT_P50_MAX_MS = 25.0
SERVE_TTFT_P50_MAX_MS = 500.0
TP_SWITCH_MAX_MS = 1.0  # a TP switch with nothing to move
TP_KV_COPY_FRACTION_MIN = 0.5  # a KV move / a device-to-device copy of the same bytes


@dataclass
class Row:
    section: str
    result: str
    numbers: str
    target: str
    verdict: str
    wall_s: float = 0.0
    budget_s: float = 0.0


@dataclass
class SectionRun:
    """What gpu_check.sh knows of one finished section."""

    section: str
    rc: int
    wall_s: float
    budget_s: float
    log: str
    data: dict | None
    gpu: bool

    @property
    def result(self) -> str:
        if self.rc == 127:
            return "MISSING"
        if self.rc in (124, 137):
            return "TIMEOUT"
        return "PASS" if self.rc == 0 else "FAIL"

    def row(self, numbers: str, target: str, met: bool | None, result: str | None = None) -> Row:
        """A row; `met` None: no target applies. Off the GPU every target is n/a."""
        verdict = "n/a" if met is None or not self.gpu else ("pass" if met else "FAIL")
        # A timeout or a failure stays one; `result` may only turn a PASS into a FAIL.
        result = result if result and self.result == "PASS" else self.result
        return Row(
            self.section, result, numbers, target, verdict, self.wall_s,
            self.budget_s,
        )  # fmt: skip


def pytest_counts(log: str) -> dict[str, int]:
    """passed / failed / skipped / errors of pytest's last summary line in `log`."""
    counts = {"passed": 0, "failed": 0, "skipped": 0, "error": 0}
    lines = [ln for ln in log.splitlines() if re.search(r"\d+ (passed|failed|error)", ln)]
    if lines:
        for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?)", lines[-1]):
            counts["error" if word.startswith("error") else word] = int(n)
    return counts


def tests_rows(run: SectionRun) -> list[Row]:
    c = pytest_counts(run.log)
    numbers = f"{c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped"
    if c["error"]:
        numbers += f", {c['error']} errors"
    ok = c["passed"] > 0 and not c["failed"] and not c["error"]
    result = run.result if run.result != "PASS" or ok else "FAIL"
    return [Row(run.section, result, numbers, "0 failed", "pass" if ok else "FAIL", run.wall_s,
                run.budget_s)]  # fmt: skip


def agreement_rows(run: SectionRun) -> list[Row]:
    if run.data is None:
        return [run.row("no summary", "all cases agree", False, "FAIL")]
    cases = run.data["cases"]
    big = [c for c in cases if c["case"].startswith("8b")]
    numbers = f"{run.data['passed']}/{len(cases)} cases"
    if big and "first_exact" in big[0]:
        numbers += "; 8B-shape first tokens " + ", ".join(
            f"{c['first_exact']}/3 exact (gap {c['first_gap_max']})"
            for c in big
            if "first_exact" in c
        )
    ok = run.data["failed"] == 0
    # NOTE: agreement is a correctness check: it is judged on the dry run too.
    return [Row(run.section, run.result, numbers, "all cases agree", "pass" if ok else "FAIL",
                run.wall_s, run.budget_s)]  # fmt: skip


def decode_rows(run: SectionRun) -> list[Row]:
    d = run.data
    if d is None or "floor_ratio_b1" not in d:
        return [run.row("no numbers", "see docs/gpu.md", False, "FAIL")]
    rates = d["decode_tok_s"]
    floor = (
        f"step {d['step_ms_b1']:.2f} ms vs floor {d['floor_ms']:.2f} ms "
        f"({d['weight_bytes'] / 1e9:.2f} GB at {d['copy_gbps']:.0f} GB/s): "
        f"{d['floor_ratio_b1']:.2f}x"
    )
    rows = [run.row(floor, f"<= {FLOOR_RATIO_MAX}x floor", d["floor_ratio_b1"] <= FLOOR_RATIO_MAX)]
    tput = ", ".join(f"b{b} {r:.0f}" for b, r in rates.items()) + " tok/s"
    waits = d.get("device_wait_share")
    if waits:  # overlapped steps: how much of each run the host waited for the device
        tput += "; host waited " + ", ".join(f"b{b} {w:.0%}" for b, w in waits.items())
    b64 = rates.get("64")
    met = None if b64 is None else b64 >= DECODE_B64_MIN
    rows.append(run.row(tput, f"b64 >= {DECODE_B64_MIN:.0f} tok/s", met))
    # NOTE: the same run: its wall time and budget are the first row's, counted once.
    rows[1].section, rows[1].wall_s, rows[1].budget_s = f"{run.section} throughput", 0.0, 0.0
    return rows


def serve_rows(run: SectionRun) -> list[Row]:
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
        f"{_ms(ttft50)} ms; TPOT p50 {_ms(tpot50)} ms; {s['n_ok']}/{s['n_requests']} ok, "
        f"{s['n_errors']} errors"
    )
    met = (
        one["wall_s"] <= SERVE_WALL_MAX_S
        and ttft50 is not None
        and ttft50 <= SERVE_TTFT_P50_MAX_MS
        and tpot50 is not None
        and tpot50 <= SERVE_TPOT_P50_MAX_MS
        and s["n_errors"] == 0
    )
    target = (
        f"wall <= {SERVE_WALL_MAX_S:.0f} s, TTFT p50 <= {SERVE_TTFT_P50_MAX_MS:.0f} ms, "
        f"TPOT p50 <= {SERVE_TPOT_P50_MAX_MS:.0f} ms, 0 errors"
    )
    result = run.result if s["n_errors"] == 0 else "FAIL"
    return [run.row(numbers, target, met, result)]


def profile_rows(run: SectionRun) -> list[Row]:
    d = run.data
    if d is None or d.get("schema") != "nitsum-profile/1":
        return [run.row("no profile", "nitsum-profile/1, TP 1", False, "FAIL")]
    pre, dec = d["prefill"]["1"], d["decode"]["1"]
    numbers = (
        f"{len(pre)} prefill + {len(dec)} decode points; prefill {pre[0]['tokens']} tok "
        f"{pre[0]['ms']:.2f} ms .. {pre[-1]['tokens']} tok {pre[-1]['ms']:.2f} ms; decode "
        f"b{dec[0]['batch']} {dec[0]['ms']:.2f} ms .. b{dec[-1]['batch']} {dec[-1]['ms']:.2f} ms"
    )
    return [run.row(numbers, "nitsum-profile/1, TP 1", None)]


def attention_rows(run: SectionRun) -> list[Row]:
    """scripts/bench_attention.py: the share of copy bandwidth at the 8k context (or the
    longest measured), and the kernel faster than gather+SDPA at every context."""
    target = f">= {ATTENTION_COPY_PCT_MIN:.0f}% of copy bw at 8k, faster than SDPA everywhere"
    if run.result == "MISSING":
        return [run.row("missing", target, None)]
    rows = (run.data or {}).get("rows") or []
    if not rows:
        return [run.row("no rows", target, False, "FAIL")]
    at = next((r for r in rows if r["context"] == 8192), rows[-1])
    slowest = min(rows, key=lambda r: r["speedup_vs_sdpa"])
    numbers = (
        f"{at['context']} ctx: {at['kernel_us']:.0f} us, {at['pct_of_copy']:.0f}% of copy bw; "
        f"vs gather+SDPA {slowest['speedup_vs_sdpa']:.2f}x at worst ({slowest['context']} ctx)"
    )
    met = at["pct_of_copy"] >= ATTENTION_COPY_PCT_MIN and slowest["speedup_vs_sdpa"] > 1.0
    return [run.row(numbers, target, met)]


def prefill_rows(run: SectionRun) -> list[Row]:
    """scripts/bench_prefill.py: the 2,048-token prefill's share of the bf16 GEMM rate, and
    its attention kernel against SDPA (flash) on the same shapes."""
    target = f">= {PREFILL_GEMM_FRACTION_MIN:.0%} of bf16 GEMM"
    if run.result == "MISSING":
        return [run.row("missing", target, None)]
    by_name = {r["name"]: r for r in (run.data or {}).get("rows") or []}
    if "prefill" not in by_name:
        return [run.row("no prefill row", target, False, "FAIL")]
    pre, attn = by_name["prefill"], by_name.get("attention_triton")
    numbers = (
        f"{pre['tokens']} tok in {pre['ms']:.1f} ms, {pre['tflops']:.0f} TFLOP/s = "
        f"{pre['of_gemm']:.0%} of GEMM"
    )
    if attn is not None:
        numbers += f"; attention {attn['ms']:.2f} ms, {attn['vs_sdpa']:.2f}x SDPA's speed"
    return [run.row(numbers, target, pre["of_gemm"] >= PREFILL_GEMM_FRACTION_MIN)]


def tp_rows(run: SectionRun) -> list[Row]:
    """Correctness (judged on the dry run too, like agreement), then the switch and the KV
    move, timed on device processes that share one GPU (labelled so)."""
    d = run.data
    if d is None or "greedy" not in d:
        return [run.row("no summary", "all tokens equal TP 1's", False, "FAIL")]
    sw, g, kv, nokv = d["switch"], d["graphs"], d["kv_move"], d["switch_no_kv"]
    parts = ("bind", "sp", "pp")
    lost = sw["requests"] - sw["completed"]
    ok = all(d["greedy"].values()) and sw["same_tokens"] and lost == 0
    ok = ok and all(d[k]["same_tokens"] for k in parts)
    eq = {True: "=", False: "!="}
    numbers = "; ".join([
        f"{d['devices']} devices, {d['layers']} layers, {d['collectives']} collectives",
        "greedy " + ", ".join(f"{k.upper()} {eq[v]} TP1" for k, v in d["greedy"].items()),
        f"1->2->4->1 with {sw['requests']} requests: tokens {eq[sw['same_tokens']]} unswitched, "
        f"{lost} lost",
        "bind, SP, PP " + ", ".join(f"{eq[d[k]['same_tokens']]} TP1" for k in parts),
        f"graphs {g['graph_captures']} recorded, {g['graph_replays']} replays, "
        f"{g['graph_cuts']} cuts",
    ])  # fmt: skip
    verdict = "pass" if ok else "FAIL"
    target = "all tokens equal TP 1's, 0 lost"
    rows = [Row(run.section, run.result if ok else "FAIL", numbers, target, verdict, run.wall_s,
                run.budget_s)]  # fmt: skip
    with_kv = ", ".join(
        f"->{s['to']} {s['ms']:.1f} ms ({s['bytes'] / 2**20:.0f} MiB)" for s in sw["switches"]
    )
    numbers = f"no KV p50 {nokv['p50_ms']:.2f} ms (p99 {nokv['p99_ms']:.2f}); with KV {with_kv}"
    target = f"<= {TP_SWITCH_MAX_MS:g} ms without KV"
    rows.append(run.row(numbers, target, nokv["p50_ms"] <= TP_SWITCH_MAX_MS))
    numbers = (
        f"{kv['bytes'] / 2**20:.0f} MiB at {kv['gbps']:.1f} GB/s = {kv['of_copy']:.0%} of a "
        f"device copy ({kv['copy_gbps']:.1f} GB/s)"
    )
    target = f">= {TP_KV_COPY_FRACTION_MIN:.0%} of a device copy"
    rows.append(run.row(numbers, target, kv["of_copy"] >= TP_KV_COPY_FRACTION_MIN))
    label = " (shared GPU)" if d["gpu"] else ""
    for row, name in zip(rows[1:], ("switch", "KV move"), strict=True):
        row.section, row.wall_s, row.budget_s = f"{run.section} {name}{label}", 0.0, 0.0
    return rows


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


EVALUATORS: dict[str, Callable[[SectionRun], list[Row]]] = {
    "tests": tests_rows,
    "agreement": agreement_rows,
    "decode": decode_rows,
    "attention": attention_rows,
    "prefill": prefill_rows,
    "serve": serve_rows,
    "profile": profile_rows,
    "tp": tp_rows,
}


def rows_of(run: SectionRun) -> list[Row]:
    """The section's rows; a section whose output cannot be read is one FAIL row."""
    try:
        return EVALUATORS[run.section](run)
    except (KeyError, TypeError, ValueError, IndexError) as e:
        return [run.row(f"unreadable output: {type(e).__name__}: {e}", "-", False, "FAIL")]


def read_json(text: str) -> dict | None:
    """The JSON object of a file or of a program's stdout: the whole text, else its last line
    that parses as an object (a benchmark may print progress before it)."""
    for candidate in [text, *reversed(text.splitlines())]:
        try:
            data = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        if isinstance(data, dict):
            return data
    return None


def table(rows: list[Row], device: str) -> str:
    """The markdown table, a line of totals under it."""
    out = [
        "| section | result | key numbers | target | verdict | wall s (budget) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        wall = f"{r.wall_s:.0f} ({r.budget_s:.0f})" if r.budget_s else ""
        out.append(
            f"| {r.section} | {r.result} | {r.numbers} | {r.target} | {r.verdict} | {wall} |"
        )
    failed = sum(r.result != "PASS" and r.result != "MISSING" for r in rows)
    missed = sum(r.verdict == "FAIL" for r in rows)
    note = "" if device.startswith("cuda") else " (CPU dry run: timings are meaningless)"
    out.append("")
    out.append(
        f"{len(rows)} rows on {device}{note}: {failed} failed or timed out, {missed} missed "
        f"their target; sections took {sum(r.wall_s for r in rows):.0f} s"
    )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("row")
    r.add_argument("section", choices=sorted(EVALUATORS))
    r.add_argument("--rc", type=int, required=True)
    r.add_argument("--wall", type=float, required=True)
    r.add_argument("--budget", type=float, default=0.0)
    r.add_argument("--log", type=Path, required=True)
    r.add_argument("--json", type=Path, default=None)
    r.add_argument("--device", default="cuda")
    t = sub.add_parser("table")
    t.add_argument("rows", type=Path)
    t.add_argument("--device", default="cuda")
    args = ap.parse_args(argv)
    if args.cmd == "table":
        lines = args.rows.read_text().splitlines() if args.rows.exists() else []
        print(table([Row(**json.loads(ln)) for ln in lines if ln.strip()], args.device))
        return 0
    log = args.log.read_text(errors="replace") if args.log.exists() else ""
    data = read_json(args.json.read_text()) if args.json and args.json.exists() else None
    run = SectionRun(
        args.section, args.rc, args.wall, args.budget, log, data, args.device.startswith("cuda")
    )
    for row in rows_of(run):
        print(json.dumps(asdict(row)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
