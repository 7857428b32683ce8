"""`python -m nitsum.worker` as a real process: loads an HF dir, serves a fake router, stops.

Needs the HF weights loader (`nitsum.weights.hf`); skipped where it is not merged yet.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nitsum.sampling import SamplingParams
from nitsum.worker import protocol as proto
from test_worker_server import FakeRouter
from tiny import make_tiny

# Spawns processes (devices, workers, router): out of the fast lane (scripts/test.sh --fast).
pytestmark = pytest.mark.e2e

pytest.importorskip("nitsum.weights.hf")

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    hf, _ = make_tiny("llama-gqa")
    path = tmp_path_factory.mktemp("models") / "tiny-llama"
    hf.save_pretrained(path, safe_serialization=True)
    return hf, path


@pytest.fixture
def run_worker(tiny_dir):
    started: list[tuple[subprocess.Popen, FakeRouter]] = []

    def start() -> tuple[subprocess.Popen, FakeRouter]:
        router = FakeRouter()
        cmd = [sys.executable, "-m", "nitsum.worker", "--model", str(tiny_dir[1])]
        cmd += ["--worker-id", "0", "--router", router.addr, "--threads", "1"]
        cmd += ["--kv-cache-mb", "1", "--page-tokens", "4"]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        proc = subprocess.Popen(cmd, env=env, cwd=ROOT)
        started.append((proc, router))
        return proc, router

    yield start
    for proc, router in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        router.close()


def test_worker_process_generates_transformers_greedy_and_stops_on_sigterm(run_worker, tiny_dir):
    hf, path = tiny_dir
    proc, router = run_worker()
    reg = router.expect("register", timeout=60)
    assert (reg["worker_id"], reg["model"], reg["tp_levels"]) == (0, "tiny-llama", [1])
    router.send(proto.Registered(0))
    ids = torch.randint(0, 128, (11,), generator=torch.Generator().manual_seed(4)).tolist()
    router.send(proto.generate("r", ids, SamplingParams(max_tokens=6, temperature=0)))
    got = router.collect({"r"})["r"]
    with torch.no_grad():
        ref = hf.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False)[0, 11:].tolist()
    assert [t for m in got for t in m["token_ids"]] == ref
    assert got[-1]["finish_reason"] in ("length", "stop")
    long = SamplingParams(max_tokens=10_000, temperature=0, ignore_eos=True)
    router.send(proto.generate("long", ids, long))
    router.expect("tokens", request_id="long")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0
    final = router.collect({"long"})["long"][-1]
    assert (final["finish_reason"], final["error"]) == ("error", "worker shut down")


def test_worker_process_exits_on_shutdown_message(run_worker):
    proc, router = run_worker()
    router.expect("register", timeout=60)
    router.send(proto.Shutdown())
    assert proc.wait(15) == 0


def test_worker_process_reports_a_bad_model_dir(tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["GPT2LMHeadModel"]}')
    cmd = [sys.executable, "-m", "nitsum.worker", "--model", str(tmp_path), "--worker-id", "0"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert "cannot load model" in res.stderr and "GPT2LMHeadModel" in res.stderr
