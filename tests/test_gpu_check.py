"""scripts/gpu_check.sh without a GPU: its table judges each section's output against the GPU
targets (gpu_table.py), and its CPU dry run of the profile and missing-benchmark sections
writes the table and the profile into $OUT."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import gpu_table as gt  # noqa: E402


def run(section: str, rc: int = 0, log: str = "", data: dict | None = None, gpu: bool = True):
    return gt.rows_of(gt.SectionRun(section, rc, 10.0, 60.0, log, data, gpu))


def decode_data(step_ms: float, b64: float) -> dict:
    return {
        "weight_bytes": 15e9,
        "copy_gbps": 4000.0,
        "floor_ms": 3.75,
        "step_ms_b1": step_ms,
        "floor_ratio_b1": step_ms / 3.75,
        "decode_tok_s": {"1": 1e3 / step_ms, "16": 3000.0, "64": b64},
    }


def serve_data(wall: float, ttft: float, tpot: float, errors: int) -> dict:
    lat = {"ttft_ms": {"p50": ttft}, "tpot_ms": {"p50": tpot}}
    summary = {"duration_s": 40.0, "n_ok": 100 - errors, "n_requests": 100, "n_errors": errors}
    return {"runs": [{"wall_s": wall, "summary": summary | {"latency": lat}}]}


def test_pytest_counts_come_from_the_last_summary_line():
    log = "...\n1 passed in 0.1s\nFFF\n3 failed, 12 passed, 2 skipped, 1 error in 40.2s\n"
    assert gt.pytest_counts(log) == {"passed": 12, "failed": 3, "skipped": 2, "error": 1}
    [row] = run("tests", rc=1, log=log)
    assert (row.result, row.verdict) == ("FAIL", "FAIL")
    [row] = run("tests", log="14 passed in 50.09s")
    assert (row.result, row.numbers, row.verdict) == (
        "PASS",
        "14 passed, 0 failed, 0 skipped",
        "pass",
    )
    [row] = run("tests", log="no tests ran")  # nothing passed: not a proof
    assert row.verdict == "FAIL"


def test_decode_rows_judge_the_floor_ratio_and_batch_64():
    floor, tput = run("decode", data=decode_data(step_ms=4.5, b64=8000.0))
    assert "1.20x" in floor.numbers and floor.verdict == "pass"
    assert "b64 8000" in tput.numbers and tput.verdict == "pass"
    floor, tput = run("decode", data=decode_data(step_ms=5.0, b64=3031.0))
    assert (floor.verdict, tput.verdict) == ("FAIL", "FAIL")
    waits = decode_data(step_ms=4.5, b64=8000.0) | {"device_wait_share": {"1": 0.97, "64": 0.4}}
    _, tput = run("decode", data=waits)
    assert tput.numbers.endswith("; host waited b1 97%, b64 40%")
    # Off the GPU the same numbers are not judged.
    floor, tput = run("decode", data=decode_data(step_ms=5.0, b64=3031.0), gpu=False)
    assert (floor.verdict, tput.verdict) == ("n/a", "n/a")


def test_serve_row_needs_every_target_and_no_errors():
    [row] = run("serve", data=serve_data(wall=45.0, ttft=300.0, tpot=20.0, errors=0))
    assert row.verdict == "pass" and "TPOT p50 20.0 ms" in row.numbers
    [row] = run("serve", data=serve_data(wall=45.0, ttft=300.0, tpot=26.0, errors=0))
    assert row.verdict == "FAIL"
    [row] = run("serve", data=serve_data(wall=45.0, ttft=300.0, tpot=20.0, errors=3))
    assert (row.result, row.verdict) == ("FAIL", "FAIL")


def test_other_benchmarks_missing_timed_out_or_judged_by_their_gemm_fraction():
    [row] = run("attention", rc=127)
    assert (row.result, row.numbers, row.verdict) == ("MISSING", "missing", "n/a")
    ctx = {"speedup_vs_sdpa": 1.5, "kernel_us": 200.0, "pct_of_copy": 65.0}
    rows = [ctx | {"context": 2048}, ctx | {"context": 8192}]
    [row] = run("attention", data={"rows": rows})
    assert row.verdict == "pass" and row.numbers.startswith("8192 ctx: 200 us, 65% of copy")
    rows[0]["speedup_vs_sdpa"] = 0.9  # slower than gather+SDPA at one context
    [row] = run("attention", data={"rows": rows})
    assert row.verdict == "FAIL" and "0.90x at worst (2048 ctx)" in row.numbers
    pre = {"name": "prefill", "tokens": 2048, "ms": 60.0, "tflops": 400.0, "of_gemm": 0.62}
    attn = {"name": "attention_triton", "ms": 1.5, "vs_sdpa": 1.1}
    [row] = run("prefill", data={"rows": [{"name": "gemm"}, pre, attn]})
    assert row.verdict == "pass" and "= 62% of GEMM; attention 1.50 ms, 1.10x" in row.numbers
    [row] = run("prefill", data={"rows": [pre | {"of_gemm": 0.3}]})
    assert row.verdict == "FAIL"
    [row] = run("prefill", data={"rows": [attn]})
    assert (row.result, row.verdict) == ("FAIL", "FAIL")
    [row] = run("decode", rc=124)  # a timeout stays a timeout, with no numbers
    assert row.result == "TIMEOUT"


def test_read_json_takes_the_last_object_line_of_a_programs_output():
    assert gt.read_json('progress 1\n{"a": 1}\n{"b": 2}\ndone\n') == {"b": 2}
    assert gt.read_json('{\n "a": 1\n}\n') == {"a": 1}
    assert gt.read_json("no json here") is None


def test_table_has_a_row_per_result_and_a_totals_line():
    rows = run("tests", log="3 passed in 1s") + run("attention", rc=127)
    text = gt.table(rows, "cpu")
    lines = text.splitlines()
    assert lines[0].startswith("| section | result |") and len(lines) == 2 + 2 + 2
    assert "| tests | PASS | 3 passed, 0 failed, 0 skipped |" in text
    assert "CPU dry run" in lines[-1] and "0 failed or timed out" in lines[-1]
    # The decode run's two rows count its wall time once.
    rows = run("decode", data=decode_data(step_ms=4.5, b64=8000.0))
    assert gt.table(rows, "cuda").endswith("sections took 10 s")


def test_cpu_dry_run_writes_the_table_and_the_engine_profile(tmp_path):
    """The script end to end on CPU for its cheap sections: the attention benchmark (tiny,
    under the interpreter) and the engine profile of a random 2-layer model (about 50 s on a
    busy 2-core machine)."""
    env = os.environ | {"OUT": str(tmp_path), "PYTHON": sys.executable}
    proc = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--device", "cpu", "--sections", "attention,profile"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    table = (tmp_path / "gpu_check.md").read_text()
    assert "| attention | PASS | 600 ctx:" in table
    assert "| profile | PASS |" in table
    profile = json.loads((tmp_path / "profile.json").read_text())
    assert profile["schema"] == "nitsum-profile/1" and profile["tp_levels"] == [1]
    assert "===== profile: rc 0" in (tmp_path / "logs.txt").read_text()


def tp_data(same: bool = True, switch_ms: float = 0.2, of_copy: float = 0.8) -> dict:
    switches = [{"to": t, "ok": True, "ms": 30.0, "moved": 16, "bytes": 3 << 20} for t in (2, 4, 1)]
    return {
        "devices": 4,
        "layers": 4,
        "gpu": True,
        "collectives": "shared",
        "greedy": {"tp2": True, "tp4": same},
        "switch": {"same_tokens": True, "completed": 16, "requests": 16, "switches": switches},
        "switch_no_kv": {"p50_ms": switch_ms, "p99_ms": 2 * switch_ms},
        "bind": {"same_tokens": True},
        "sp": {"same_tokens": True},
        "pp": {"same_tokens": True},
        "kv_move": {
            "bytes": 512 << 20,
            "gbps": 900.0,
            "copy_gbps": 900 / of_copy,
            "of_copy": of_copy,
        },
        "graphs": {"graph_captures": 600, "graph_replays": 900, "graph_cuts": 2400},
    }


def test_tp_rows_judge_tokens_everywhere_and_timings_on_the_gpu():
    ok, switch, move = run("tp", data=tp_data())
    assert (ok.verdict, switch.verdict, move.verdict) == ("pass", "pass", "pass")
    assert "TP4 = TP1" in ok.numbers and "0 lost" in ok.numbers and "2400 cuts" in ok.numbers
    assert switch.section == "tp switch (shared GPU)" and "80% of a device copy" in move.numbers
    # A token that differs fails the section, on the CPU dry run too.
    [bad, *_] = run("tp", data=tp_data(same=False), gpu=False)
    assert (bad.result, bad.verdict) == ("FAIL", "FAIL") and "TP4 != TP1" in bad.numbers
    _, switch, move = run("tp", data=tp_data(switch_ms=1.5, of_copy=0.4))
    assert (switch.verdict, move.verdict) == ("FAIL", "FAIL")
    _, switch, move = run("tp", data=tp_data(switch_ms=1.5, of_copy=0.4), gpu=False)
    assert (switch.verdict, move.verdict) == ("n/a", "n/a")  # CPU timings mean nothing
