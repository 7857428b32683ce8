"""The rows and the table of scripts/gpu_check.sh: each section's output judged against its
target.

    gpu_table.py row SECTION --rc RC --wall S --budget S --log LOG [--json F] [--device D]
        appends the section's rows (JSON lines) to stdout;
    gpu_table.py table ROWS.jsonl
        prints the markdown table of every row.

A row: section, result (PASS / FAIL / TIMEOUT / MISSING), key numbers, target, verdict
(pass / FAIL against the target; `n/a` on a CPU dry run, whose timings mean nothing, or
where no target applies). NOTE: a section's result is its own exit status (and that its
numbers could be read); the verdict is the numbers against the GPU targets (docs/gpu.md;
the decode and serving rows: gpu_perf_rows.py).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from gpu_perf_rows import bursty_rows, decode_rows, serve_rows  # scripts/ is on the path
from gpu_row import Row, SectionRun
from gpu_tp_rows import tp_rows

# Standing targets of earlier issues (issue 38's are in gpu_perf_rows.py).
ATTENTION_COPY_PCT_MIN = 60.0  # decode attention, batch 16, 8k context
PREFILL_GEMM_FRACTION_MIN = 0.5  # prefill rate / bf16 GEMM rate


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
    """kernels/benchmarks/bench_attention.py: the share of copy bandwidth at the 8k context (or
    the longest measured), and the kernel faster than gather+SDPA at every context."""
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
    """scripts/bench_prefill.py: the 2,048-token prefill's share of the bf16 GEMM rate, the
    same step on one id repeated (the 2026-11-27 profile's prompt), and its attention kernel
    against SDPA (flash) on the same shapes."""
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
    same = by_name.get("prefill_constant_ids")
    if same is not None:  # the 2026-11-27 profile's prompt: one id repeated
        numbers += f"; one id repeated {same['ms']:.1f} ms ({same['vs_random_ids']:.2f}x)"
    if attn is not None:
        numbers += f"; attention {attn['ms']:.2f} ms, {attn['vs_sdpa']:.2f}x SDPA's speed"
    return [run.row(numbers, target, pre["of_gemm"] >= PREFILL_GEMM_FRACTION_MIN)]


EVALUATORS: dict[str, Callable[[SectionRun], list[Row]]] = {
    "tests": tests_rows,
    "agreement": agreement_rows,
    "decode": decode_rows,
    "attention": attention_rows,
    "prefill": prefill_rows,
    "serve": serve_rows,
    "bursty": bursty_rows,
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
