"""The evidence of gpu_check.sh runs (scripts/gpu_runs.py): a run's work dir packed into the
two files the device tool brings back, unpacked into docs/gpu/runs/<date>-<device>/, and
docs/gpu.md's runs section generated from those directories and in step with them."""

from __future__ import annotations

import json
import random
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import gpu_runs  # noqa: E402
import gpu_runs_doc  # noqa: E402

HEAD = "gpu_check 2026-11-29T10:00Z on cuda (NVIDIA H200), commit abc1234"


def decode_json() -> dict:
    point = {"batch": 1, "prompt": 1024, "tok_s": 200.0, "step_ms": 5.0, "kv_bytes": 1.4e8,
             "floor_ms": 3.6, "floor_ratio": 1.39, "pct_copy": 72.0, "pct_spec": 63.0,
             "host_waited": 0.9}  # fmt: skip
    return {"new_tokens": 64, "copy_gbps": 4200.0, "spec_gbps": 4800.0, "weight_bytes": 15e9,
            "points": [point]}  # fmt: skip


def serve_json() -> dict:
    dist = {"mean": 1.0, "p50": 4.8, "p90": 5.0, "p99": 6.5}
    lat = {"ttft_ms": dist, "itl_ms": dist, "tpot_ms": dist, "e2e_s": dist}
    summary = {"n_ok": 8, "n_requests": 8, "n_errors": 0, "output_tokens_per_s": 190.0,
               "input_tokens_per_s": 1520.0, "latency": lat}  # fmt: skip
    return {"runs": [{"max_concurrency": 1, "wall_s": 5.4, "summary": summary}]}


def work_dir(tmp: Path) -> Path:
    """What gpu_check.sh leaves in its work dir: the evidence, and what is not (the model,
    caches, installed wheels)."""
    w = tmp / "work"
    (w / "rand-model").mkdir(parents=True)
    (w / "rand-model" / "config.json").write_text("{}")
    (w / "site").mkdir()
    row = {"section": "serve c1", "result": "PASS", "numbers": "8/8 ok", "target": "-",
           "verdict": "pass", "wall_s": 60.0, "budget_s": 90.0}  # fmt: skip
    (w / "rows.jsonl").write_text(json.dumps(row) + "\n")
    (w / "logs.txt").write_text("===== serve: rc 0\n")
    (w / "gpu_check.md").write_text(HEAD + "\n\n| table |\n")
    (w / "decode.json").write_text(json.dumps(decode_json()))
    (w / "serve.json").write_text(json.dumps(serve_json()))
    (w / "serve-steps.jsonl").write_text('{"step": 1}\n' * 1000)
    (w / "serve-server.log").write_text("ready\n")
    (w / "serve.log").write_text("[serve] model ready\n")  # in logs.txt already
    (w / "model.safetensors").write_bytes(b"\0" * 100)
    return w


def test_pack_keeps_the_evidence_in_two_files_and_unpack_makes_a_run_dir(tmp_path):
    out, runs = tmp_path / "OUT", tmp_path / "runs"
    gpu_runs.pack(work_dir(tmp_path), out, HEAD, "cuda")
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.md", "run.tar.gz"]
    with tarfile.open(out / "run.tar.gz") as tar:
        names = sorted(tar.getnames())
    assert names == ["decode.json", "gpu_check.md", "logs.txt", "meta.json", "rows.jsonl",
                     "serve-server.log", "serve-steps.jsonl", "serve.json"]  # fmt: skip
    run = gpu_runs.unpack(out, runs)
    meta = json.loads((run / "meta.json").read_text())
    assert run.name == f"{meta['date']}-nvidia-h200" and meta["gpu"] == "NVIDIA H200"
    assert not meta["dry_run"] and meta["head"] == HEAD
    assert (run / "serve-steps.jsonl").read_text().count("\n") == 1000
    with pytest.raises(FileExistsError, match="holds this run already"):
        gpu_runs.unpack(out, runs)
    # Another run of the same day and device goes beside it.
    later = HEAD.replace("10:00Z", "10:09Z")
    gpu_runs.pack(work_dir(tmp_path / "b"), tmp_path / "OUT2", later, "cuda")
    assert gpu_runs.unpack(tmp_path / "OUT2", runs).name == run.name + "-2"


def test_an_archive_over_the_tools_limit_drops_step_and_server_logs_first(tmp_path, monkeypatch):
    w = work_dir(tmp_path)
    (w / "serve-steps.jsonl").write_bytes(random.Random(0).randbytes(300_000))  # incompressible
    monkeypatch.setattr(gpu_runs, "MAX_FILE", 200_000)
    archive = gpu_runs.pack(w, tmp_path / "OUT", HEAD, "cuda")
    assert archive.stat().st_size <= 200_000
    with tarfile.open(archive) as tar:
        meta = json.load(tar.extractfile("meta.json"))  # type: ignore[arg-type]
        assert "serve-steps.jsonl" not in tar.getnames() and "serve.json" in tar.getnames()
    assert meta["left_out"] == ["serve-steps.jsonl"]


def test_unpack_refuses_what_gpu_check_did_not_write(tmp_path):
    out = tmp_path / "OUT"
    out.mkdir()
    with tarfile.open(out / "run.tar.gz", "w:gz") as tar:
        (tmp_path / "x").write_text("x")
        tar.add(tmp_path / "x", arcname="../x")
    with pytest.raises(ValueError, match="unexpected members"):
        gpu_runs.unpack(out, tmp_path / "runs")


def test_a_run_renders_its_table_its_decode_and_serving_rows_and_a_dry_run_says_so(tmp_path):
    out, runs = tmp_path / "OUT", tmp_path / "runs"
    gpu_runs.pack(work_dir(tmp_path), out, HEAD.replace("cuda (NVIDIA H200)", "cpu (no GPU)"),
                  "cpu")  # fmt: skip
    run = gpu_runs.unpack(out, runs)
    assert run.name.endswith("-cpu-dry-run")
    text = gpu_runs_doc.render(runs)
    assert "CPU dry run, not a GPU result" in text
    assert "| serve c1 | PASS | 8/8 ok | - | pass | 60 (90) |" in text
    assert "| 1 | 1024 | 200 | 5.00 | 3.60 | 1.39 | 72 | 63 |" in text
    assert "| 1 | 8 / 8 | 4.8 / 6.5 | 4.80 / 6.50 | 4.80 | 190 | 1710 |" in text
    doc = f"intro\n{gpu_runs_doc.BEGIN}\nstale\n{gpu_runs_doc.END}\nhistory\n"
    new = gpu_runs_doc.with_runs(doc, runs)
    assert "stale" not in new and new.endswith(f"{gpu_runs_doc.END}\nhistory\n")
    assert gpu_runs_doc.with_runs(new, runs) == new


def test_docs_gpu_md_is_in_step_with_the_committed_runs():
    doc = (ROOT / "docs" / "gpu.md").read_text()
    assert gpu_runs_doc.with_runs(doc, ROOT / "docs" / "gpu" / "runs") == doc, (
        "docs/gpu.md's runs section is stale: python scripts/gpu_runs.py render"
    )
    runs = sorted((ROOT / "docs" / "gpu" / "runs").glob("*/meta.json"))
    assert runs, "no committed run directory"
    for meta_file in runs:  # a dry run is named and labelled as one
        meta = json.loads(meta_file.read_text())
        assert meta["dry_run"] == meta_file.parent.name.endswith("cpu-dry-run")
