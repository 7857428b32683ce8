"""Every kernel benchmark (kernels/benchmarks/) runs with tiny arguments on CPU, under Triton's
interpreter, so a change to a kernel's interface that breaks one fails the suite: its rows
are checked, not only its exit status."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e  # a subprocess

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def test_every_benchmark_has_a_smoke_run() -> None:
    assert sorted(p.name for p in BENCHMARKS.glob("*.py")) == ["bench_attention.py"]


def test_bench_attention_tiny_on_cpu(tmp_path: Path) -> None:
    """One short context and one of several splits: a row each, the kernel agreeing with
    gather+SDPA (the script exits 1 where it does not)."""
    pytest.importorskip("triton")
    out = tmp_path / "attention.json"
    script = BENCHMARKS / "bench_attention.py"
    cmd = [sys.executable, str(script), "--device", "cpu", "--contexts", "64", "600"]
    done = subprocess.run(
        [*cmd, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=os.environ | {"TRITON_INTERPRET": "1"},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["context"] for r in rows] == [64, 600]
    assert rows[0]["splits"] == 1 and rows[1]["splits"] > 1
    # 2 sequences x 2 KV heads x head dim 32 x bf16, K and V.
    assert [r["kv_bytes"] for r in rows] == [2 * 2 * n * 2 * 32 * 2 for n in (64, 600)]
    assert all(r["max_abs_diff"] <= 5e-2 for r in rows)
