"""`nitsum serve`'s choice of the control-loop profile (no processes: files only)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from nitsum import serve
from nitsum.control_profile import (
    SHIPPED_PROFILES,
    ControlConfigError,
    choose_control_profile,
    find_profile,
    mismatch,
)

SHIPPED = SHIPPED_PROFILES / "cpu-2core-SmolLM2-135M-Instruct.json"
EMBEDDED_CONFIG = {
    "max_position_embeddings": 8192,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
}


def model(tmp_path: Path, name: str, **cfg: int) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps({**EMBEDDED_CONFIG, **cfg}))
    return d


def warnings(choice) -> list[str]:
    return [m for level, m in choice.messages if level >= logging.WARNING]


def test_the_embedded_model_gets_the_shipped_profile(tmp_path: Path) -> None:
    assert SHIPPED.is_file(), SHIPPED
    d = model(tmp_path, "SmolLM2-135M-Instruct")
    choice = choose_control_profile(d, dirs=[SHIPPED_PROFILES])
    assert (choice.control, choice.profile) == (True, SHIPPED)
    assert not warnings(choice)
    assert any("control loop on" in m and str(SHIPPED) in m for _, m in choice.messages)
    # the default search (./profiles, then the shipped directory) finds it from anywhere
    assert choose_control_profile(d).profile == SHIPPED


def test_a_model_no_profile_describes_runs_static_with_a_warning(tmp_path: Path) -> None:
    other = model(tmp_path, "my-finetune")
    choice = choose_control_profile(other, dirs=[SHIPPED_PROFILES])
    assert (choice.control, choice.profile) == (False, None)
    [w] = warnings(choice)
    assert "no profile" in w and "my-finetune" in w and "control loop off" in w, w
    assert "nitsum profile --model" in w and "--no-control" in w, w
    # same name, other architecture: not described either (never another model's profile)
    same_name = tmp_path / "x"
    same_name.mkdir()
    look_alike = model(same_name, "SmolLM2-135M-Instruct", max_position_embeddings=2048)
    assert mismatch(json.loads(SHIPPED.read_text()), look_alike) == (
        "its context window 8192 is not the model's 2048"
    )
    assert choose_control_profile(look_alike, dirs=[SHIPPED_PROFILES]).profile is None
    odd = tmp_path / "y"
    odd.mkdir()
    four_kv = model(odd, "SmolLM2-135M-Instruct", num_key_value_heads=4)
    assert "TP levels [3]" in mismatch(json.loads(SHIPPED.read_text()), four_kv)
    # TP 3 above one KV head replicates it: a level the model can run, so the profile fits.
    mqa = tmp_path / "z"
    mqa.mkdir()
    one_kv = model(mqa, "SmolLM2-135M-Instruct", num_key_value_heads=1)
    assert mismatch(json.loads(SHIPPED.read_text()), one_kv) is None


def test_cuda_has_no_measured_profile(tmp_path: Path) -> None:
    d = model(tmp_path, "SmolLM2-135M-Instruct")
    choice = choose_control_profile(d, device="cuda", dirs=[SHIPPED_PROFILES])
    assert (choice.control, choice.profile) == (False, None)
    assert "--device cuda" in warnings(choice)[0]


def test_this_hosts_own_measurement_wins(tmp_path: Path) -> None:
    d = model(tmp_path, "SmolLM2-135M-Instruct")
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    profile = json.loads(SHIPPED.read_text())
    (first / "other.json").write_text(json.dumps(dict(profile, device="cpu-99core")))
    (first / "gpu.json").write_text(json.dumps(dict(profile, device="h100", analytic=True)))
    host = dict(profile, device=f"cpu-{os.cpu_count()}core")
    (second / "host.json").write_text(json.dumps(host))
    (second / "later.json").write_text(json.dumps(dict(profile, device="cpu-98core")))
    assert find_profile(d, [first, second]) == second / "host.json"
    (second / "host.json").unlink()
    # no measurement of this host: the first directory in the search order wins
    assert find_profile(d, [first, second]) == first / "other.json"
    assert find_profile(d, [second, first]) == second / "later.json"


def test_explicit_profile_and_config_profile(tmp_path: Path) -> None:
    other = model(tmp_path, "my-finetune")
    choice = choose_control_profile(other, profile=str(SHIPPED), dirs=[])
    assert (choice.control, choice.profile) == (True, SHIPPED)
    assert "may not describe my-finetune" in warnings(choice)[0]
    cfg = tmp_path / "router.json"
    cfg.write_text(json.dumps({"profile": "p.json"}))
    choice = choose_control_profile(other, config=str(cfg), dirs=[])
    assert (choice.control, choice.profile) == (True, None)  # the router reads it
    assert "p.json" in choice.messages[0][1]


def test_no_control_turns_it_off_and_refuses_contradictions(tmp_path: Path) -> None:
    d = model(tmp_path, "SmolLM2-135M-Instruct")
    choice = choose_control_profile(d, control=False, dirs=[SHIPPED_PROFILES])
    assert (choice.control, choice.profile, warnings(choice)) == (False, None, [])
    with pytest.raises(ControlConfigError, match="--no-control contradicts --profile"):
        choose_control_profile(d, profile=str(SHIPPED), control=False)
    cfg = tmp_path / "router.json"
    cfg.write_text(json.dumps({"profile": "p.json"}))
    with pytest.raises(ControlConfigError, match=r"config's profile \(p.json\)"):
        choose_control_profile(d, control=False, config=str(cfg))
    # an unreadable config is the router's to report
    assert choose_control_profile(d, config=str(tmp_path / "nope.json"), dirs=[]).profile is None


def test_serve_flags_and_the_default_topology() -> None:
    parse = serve.build_parser().parse_args
    assert (parse([]).control, parse([]).tp_switching) == (True, None)
    assert parse(["--no-control"]).control is False
    assert parse(["--no-tp-switching"]).tp_switching is False
    # the control loop on CPU gets one host worker (TP groups and P/D need one process) ...
    assert serve.use_host_worker(None, control=True, device="cpu", workers=2)
    # ... not without the loop, on one device, on CUDA, or when a flag says otherwise
    assert not serve.use_host_worker(None, control=False, device="cpu", workers=2)
    assert not serve.use_host_worker(None, control=True, device="cpu", workers=1)
    assert not serve.use_host_worker(None, control=True, device="cuda", workers=2)
    assert not serve.use_host_worker(False, control=True, device="cpu", workers=2)
    assert serve.use_host_worker(True, control=False, device="cpu", workers=2)
    # Several devices on one GPU are there to form groups.
    shared_gpu = dict(device="cuda", workers=4, devices_per_gpu=4)
    assert serve.use_host_worker(None, control=False, **shared_gpu)
    assert not serve.use_host_worker(False, control=True, **shared_gpu)
