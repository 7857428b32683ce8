"""scripts/bench_prefill.py off a GPU: refuses without CUDA, and `--device cpu --tiny` runs
end to end (the profile's prefill step on random ids and on one id repeated, the Triton
kernel in the interpreter, SDPA) with rows that say their timings mean nothing."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "bench_prefill.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    env = os.environ | {"PYTHONPATH": str(ROOT / "python")}
    cmd = [sys.executable, str(SCRIPT), *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_refuses_without_cuda():
    for args in ([], ["--device", "cpu"]):
        done = _run(*args)
        assert done.returncode != 0 and "bench_prefill:" in done.stderr


def test_tiny_cpu_run_writes_rows(tmp_path):
    out = tmp_path / "rows.json"
    done = _run("--device", "cpu", "--tiny", "--prompt", "80", "--warmup", "0", "--repeats", "1",
                "--json", str(out))  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = {r["name"]: r for r in json.loads(out.read_text())["rows"]}
    names = ["gemm", "prefill", "prefill_constant_ids", "attention_triton", "attention_sdpa_math"]
    assert list(rows) == names
    assert all("mean nothing" in r["note"] for r in rows.values())
    # Tiny model: 2 layers of hidden 256 (8 heads of 32, 2 KV), MLP 512, vocab 1024.
    linear = 256 * 32 * (2 * 8 + 2 * 2) + 3 * 256 * 512
    flops = 2 * (2 * linear * 80 + 4 * 80 * 80 * 32 * 8 / 2) + 2 * 256 * 1024
    assert rows["prefill"]["tflop"] == pytest.approx(flops / 1e12)
    # The same step on one id repeated (the 2026-11-27 profile's prompt), timed beside it.
    same = rows["prefill_constant_ids"]
    assert same["tflop"] == rows["prefill"]["tflop"]
    assert same["vs_random_ids"] == pytest.approx(same["ms"] / rows["prefill"]["ms"])
    # The kernel (bf16 in the interpreter) agrees with SDPA on the same prompt.
    assert rows["attention_triton"]["max_abs_diff_vs_sdpa"] < 3e-2
