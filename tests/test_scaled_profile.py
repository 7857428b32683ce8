"""A measured TP-1 profile scaled to TP > 1 (nitsum.profiling.scaled): TP 1 stays as
measured, each level is the measured/analytic ratio times the analytic compute estimate plus
the analytic all-reduce, and the result loads in the Rust planner's cost model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nitsum._core import BindingModel, Profile
from nitsum.profiling.analytic import GPUS, MODELS, _allreduce_ms, decode_ms, prefill_ms
from nitsum.profiling.scaled import main, scale

ROOT = Path(__file__).resolve().parents[1]
MEASURED = ROOT / "profiles" / "h200-nitsum-llama3-8b-shape-tp1.json"


def test_scaling_keeps_tp1_and_adds_the_collectives(tmp_path: Path) -> None:
    measured = json.loads(MEASURED.read_text())
    gpu, model = GPUS["h200"], MODELS["llama3-8b-shape-v49k"]
    out = scale(measured, gpu, model, [1, 2, 8])
    assert out["analytic"] is True and out["tp_levels"] == [1, 2, 8]
    assert out["prefill"]["1"] == measured["prefill"]["1"]
    assert out["decode"]["1"] == measured["decode"]["1"]
    p = measured["prefill"]["1"][5]  # 2048 tokens
    n, ratio = p["tokens"], p["ms"] / prefill_ms(gpu, model, 1, p["tokens"])
    ar = _allreduce_ms(gpu, model, 8, n)
    want = ratio * (prefill_ms(gpu, model, 8, n) - ar) + ar
    got = next(q["ms"] for q in out["prefill"]["8"] if q["tokens"] == n)
    assert got == pytest.approx(want, abs=1e-3) and ar > 0
    d = measured["decode"]["1"][0]
    ratio = d["ms"] / decode_ms(gpu, model, 1, d["batch"], d["context"])
    ar = _allreduce_ms(gpu, model, 2, d["batch"])
    want = ratio * (decode_ms(gpu, model, 2, d["batch"], d["context"]) - ar) + ar
    got = out["decode"]["2"][0]["ms"]
    assert got == pytest.approx(want, abs=1e-3)
    # Faster with more devices, never below the collectives alone.
    assert out["decode"]["8"][0]["ms"] < out["decode"]["2"][0]["ms"] < d["ms"]
    BindingModel(Profile(json.dumps(out)))  # the Rust loader's rules


def test_the_command_refuses_what_it_cannot_scale(tmp_path: Path) -> None:
    analytic = ROOT / "profiles" / "h100-llama3-8b-analytic.json"
    args = ["--gpu", "h200", "--model", "llama3-8b-shape-v49k", "--out", str(tmp_path / "o")]
    assert main([str(analytic), *args]) == 2
    assert main([str(MEASURED), *args, "--tp", "2", "4"]) == 2
    assert main([str(MEASURED), *args]) == 0
    shipped = json.loads((MEASURED.parent / "h200-nitsum-llama3-8b-shape-scaled.json").read_text())
    assert json.loads((tmp_path / "o").read_text()) == shipped  # the file is reproducible
