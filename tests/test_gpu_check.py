"""scripts/gpu_check.sh without a GPU: its table judges each section's output against the GPU
targets (gpu_table.py), and its CPU dry run of the attention and profile sections writes the
table and the run's archive into $OUT."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import gpu_runs  # noqa: E402
import gpu_table as gt  # noqa: E402


def run(section: str, rc: int = 0, log: str = "", data: dict | None = None, gpu: bool = True):
    return gt.rows_of(gt.SectionRun(section, rc, 10.0, 60.0, log, data, gpu))


def decode_data(b1_ratio: float, b64_tok_s: float, spec: float | None = 4800.0) -> dict:
    def point(batch: int, prompt: int, ratio: float, tok_s: float) -> dict:
        return {"batch": batch, "prompt": prompt, "tok_s": tok_s, "step_ms": batch / tok_s * 1e3,
                "kv_bytes": batch * prompt * 131072, "floor_ms": 3.6, "floor_ratio": ratio,
                "pct_copy": 100 / ratio, "pct_spec": None if spec is None else 88 / ratio,
                "host_waited": 0.95}  # fmt: skip

    points = [point(1, 1024, b1_ratio, 200.0), point(16, 1024, 1.5, 2800.0),
              point(64, 2048, 1.1, b64_tok_s)]  # fmt: skip
    return {"weight_bytes": 15e9, "copy_gbps": 4200.0, "spec_gbps": spec, "points": points}


def serve_data(itl_c1: float, tok_s_c64: float, errors: int = 0) -> dict:
    def one(c: int, itl: float, tok_s: float) -> dict:
        dist = {"mean": itl, "p50": itl, "p90": itl, "p99": 2 * itl}
        lat = {"ttft_ms": {"p50": 30.0, "p99": 60.0}, "itl_ms": dist, "tpot_ms": dist}
        summary = {"n_ok": 8 - errors, "n_requests": 8, "n_errors": errors, "latency": lat,
                   "output_tokens_per_s": tok_s}  # fmt: skip
        return {"max_concurrency": c, "wall_s": 5.0, "summary": summary}

    return {"runs": [one(1, itl_c1, 190.0), one(16, 8.0, 2000.0), one(64, 9.0, tok_s_c64)]}


def bursty_data(wall: float, ttft: float, tpot: float, errors: int) -> dict:
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


def test_decode_rows_judge_b1_at_1k_against_its_floor_and_b64_at_2k_by_tok_s():
    b1, b16, b64 = run("decode", data=decode_data(b1_ratio=1.25, b64_tok_s=8100.0))
    assert [r.section for r in (b1, b16, b64)] == [
        "decode b1 x 1024", "decode b16 x 1024", "decode b64 x 2048"]  # fmt: skip
    assert (b1.target, b1.verdict) == ("<= 1.3x floor", "pass")
    assert "(15.00 GB weights + 0.13 GB KV): 1.25x; 80% of copy rate (4200 GB/s)" in b1.numbers
    assert "70% of spec; host waited 95%" in b1.numbers
    assert (b16.target, b16.verdict) == ("-", "n/a")  # no target at this point
    assert (b64.target, b64.verdict) == (">= 8000 tok/s", "pass")
    assert b64.numbers.startswith("8100 tok/s, step 7.90 ms")
    b1, _, b64 = run("decode", data=decode_data(b1_ratio=1.33, b64_tok_s=7900.0))
    assert (b1.verdict, b64.verdict) == ("FAIL", "FAIL")
    # A device without a spec sheet has no % of spec; the run's wall time counts once.
    b1, b16, _ = run("decode", data=decode_data(1.25, 8100.0, spec=None))
    assert "% of copy rate (4200 GB/s), - of spec" in b1.numbers
    assert (b1.wall_s, b16.wall_s) == (10.0, 0.0)
    # Off the GPU the same numbers are not judged.
    rows = run("decode", data=decode_data(b1_ratio=1.33, b64_tok_s=7900.0), gpu=False)
    assert {r.verdict for r in rows} == {"n/a"}


def test_serve_rows_judge_itl_at_concurrency_1_and_output_rate_at_64():
    c1, c16, c64 = run("serve", data=serve_data(itl_c1=4.9, tok_s_c64=8100.0))
    assert [r.section for r in (c1, c16, c64)] == ["serve c1", "serve c16", "serve c64"]
    assert c1.numbers == (
        "8/8 ok; TTFT p50 30.0 p99 60.0 ms; ITL p50 4.90 p99 9.80 ms; TPOT p50 4.90 ms; "
        "190 output tok/s"
    )
    assert (c1.verdict, c16.verdict, c64.verdict) == ("pass", "n/a", "pass")
    c1, _, c64 = run("serve", data=serve_data(itl_c1=5.1, tok_s_c64=4000.0))
    assert (c1.verdict, c64.verdict) == ("FAIL", "FAIL")
    rows = run("serve", data=serve_data(itl_c1=4.9, tok_s_c64=8100.0, errors=1))
    assert {(r.result, r.verdict) for r in rows} == {("FAIL", "FAIL"), ("FAIL", "n/a")}
    [row] = run("serve", data={"runs": []})
    assert (row.result, row.verdict) == ("FAIL", "FAIL")


def test_bursty_row_needs_every_target_and_no_errors():
    [row] = run("bursty", data=bursty_data(wall=45.0, ttft=300.0, tpot=20.0, errors=0))
    assert row.verdict == "pass" and "TPOT p50 20.0 ms" in row.numbers
    [row] = run("bursty", data=bursty_data(wall=45.0, ttft=300.0, tpot=26.0, errors=0))
    assert row.verdict == "FAIL"
    [row] = run("bursty", data=bursty_data(wall=45.0, ttft=300.0, tpot=20.0, errors=3))
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
    same = {"name": "prefill_constant_ids", "ms": 54.0, "vs_random_ids": 0.9}
    attn = {"name": "attention_triton", "ms": 1.5, "vs_sdpa": 1.1}
    [row] = run("prefill", data={"rows": [{"name": "gemm"}, pre, same, attn]})
    assert row.verdict == "pass"
    assert "= 62% of GEMM; one id repeated 54.0 ms (0.90x); attention 1.50 ms, 1.10x" in row.numbers
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
    # The decode run's rows count its wall time once.
    rows = run("decode", data=decode_data(b1_ratio=1.2, b64_tok_s=8000.0))
    assert gt.table(rows, "cuda").endswith("sections took 10 s")


def test_cpu_dry_run_writes_the_table_and_an_archive_of_the_run(tmp_path):
    """The script end to end on CPU for its cheap sections: the attention benchmark (tiny,
    under the interpreter) and the engine profile of a random 2-layer model (about 50 s on a
    busy 2-core machine); $OUT gets the table and the archive that unpacks into a run dir."""
    out = tmp_path / "OUT"
    env = os.environ | {"OUT": str(out), "PYTHON": sys.executable}
    proc = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--device", "cpu", "--sections", "attention,profile"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.md", "run.tar.gz"]
    table = (out / "gpu_check.md").read_text()
    assert "| attention | PASS | 600 ctx:" in table
    assert "| profile | PASS |" in table
    run_dir = gpu_runs.unpack(out, tmp_path / "runs")
    assert run_dir.name.endswith("-cpu-dry-run")
    profile = json.loads((run_dir / "profile.json").read_text())
    assert profile["schema"] == "nitsum-profile/1" and profile["tp_levels"] == [1]
    assert "===== profile: rc 0" in (run_dir / "logs.txt").read_text()
    assert (run_dir / "gpu_check.md").read_text() == table


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
            "direct": True,
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
