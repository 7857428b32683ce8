"""`nitsum simulate --binding`: the simulator models per-request TP binding (issue 32)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

core = pytest.importorskip("nitsum._core")
if not hasattr(core, "simulate"):
    pytest.skip("nitsum._core built without the simulator", allow_module_level=True)

from nitsum.simulate import main  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# 4,096-token prompts under a 100 ms TTFT: TP 1 alone takes 119 ms on this profile, TP 4 38.
TIERS = [
    {"name": "premium", "ttft_ms": 100.0, "tpot_ms": 50.0, "bind_tp": 4},
    {"name": "relaxed", "ttft_ms": 2000.0, "tpot_ms": 100.0},
]


def _run(tmp_path: Path, binding: str) -> dict:
    (tmp_path / "t.json").write_text(json.dumps(TIERS))
    rows = [
        {"timestamp": 0.1 * i, "input_length": 4096 if i % 4 == 0 else 512, "output_length": 64}
        for i in range(200)
    ]
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / f"{binding}.json"
    argv = [
        "--profile",
        str(ROOT / "profiles" / "h100-llama3-8b-analytic.json"),
        "--tiers",
        str(tmp_path / "t.json"),
        "--trace",
        str(tmp_path / "a.jsonl"),
        "--mix",
        "premium=0.25,relaxed=0.75",
        "--devices",
        "8",
        "--policy",
        "nitsum-fixed-tp",
        "--tp",
        "1",
        "--binding",
        binding,
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    return json.loads(out.read_text())


def test_binding_is_modelled_and_counted(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    off = _run(tmp_path, "off")
    assert "bindings" not in off
    cost = _run(tmp_path, "cost")
    b = cost["bindings"]
    assert b["dp"] + b["prefill"] + b["full"] == off["per_tier"]["premium"]["requests"]
    assert b["prefill"] + b["full"] > 0
    assert "binding (cost):" in capsys.readouterr().out
    long_premium = lambda r: r["per_tier"]["premium"]["ttft_ms"]["p90"]  # noqa: E731
    assert long_premium(cost) < long_premium(off)
    always = _run(tmp_path, "always")
    assert always["bindings"]["full"] == b["dp"] + b["prefill"] + b["full"]


def test_an_unknown_binding_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as e:
        _run(tmp_path, "sometimes")
    assert e.value.code == 2
