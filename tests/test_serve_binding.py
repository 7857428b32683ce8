"""`nitsum serve` hands its workers the binding cost model's profile and policy: the control
profile by default (the one the router gets with `--profile`), the user's `--binding-profile`
over it, none without the control loop; `--bind-policy` as given."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from nitsum import serve_commands as sc
from nitsum.control_profile import ControlChoice
from nitsum.serve_binding import resolve_binding
from nitsum.serve_flags import build_parser
from nitsum.worker.__main__ import build_parser as worker_parser
from nitsum.worker.__main__ import engine_config
from test_worker_serve import FAKE_ROUTER, FAKE_WORKER, ROOT, free_port

SHIPPED = ROOT / "profiles" / "h100-llama3-8b-analytic.json"


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def model_dir(tmp_path: Path) -> Path:
    d = tmp_path / "tiny"
    d.mkdir(exist_ok=True)
    d.joinpath("config.json").write_text("{}")
    return d


def commands(tmp_path: Path, args: argparse.Namespace) -> list[list[str]]:
    d = model_dir(tmp_path)
    return [
        sc.worker_command(0, d, "tcp://x", "m", args),
        sc.host_worker_command(d, "tcp://x", "m", args),
    ]


def flag(cmd: list[str], name: str) -> str | None:
    return cmd[cmd.index(name) + 1] if name in cmd else None


def test_the_control_profile_reaches_every_worker_and_their_engine_config(tmp_path):
    args = parse("--bind-policy", "always")
    assert resolve_binding(args, ControlChoice(True, SHIPPED)) == []
    for cmd in commands(tmp_path, args):
        assert flag(cmd, "--binding-profile") == str(SHIPPED)
        assert flag(cmd, "--bind-policy") == "always"
        ecfg = engine_config(worker_parser().parse_args(cmd[3:]))
        assert (ecfg.binding_profile, ecfg.bind_policy) == (str(SHIPPED), "always")


def test_without_the_control_loop_no_profile_and_the_workers_default_policy(tmp_path, caplog):
    args = parse("--no-control", "--bind-policy", "cost")
    assert resolve_binding(args, ControlChoice(False, None)) == []
    assert "cannot weigh bindings" in caplog.text
    for cmd in commands(tmp_path, args):
        assert "--binding-profile" not in cmd
        assert flag(cmd, "--bind-policy") == "cost"
    plain = parse("--no-control")
    resolve_binding(plain, ControlChoice(False, None))
    for cmd in commands(tmp_path, plain):
        assert "--binding-profile" not in cmd and "--bind-policy" not in cmd
        w = worker_parser().parse_args(cmd[3:])
        assert (w.binding_profile, w.bind_policy) == (None, "cost")


def test_the_users_binding_profile_wins_even_without_control(tmp_path):
    own = tmp_path / "own.json"
    own.write_text(SHIPPED.read_text())
    for choice in (ControlChoice(True, SHIPPED), ControlChoice(False, None)):
        args = parse("--binding-profile", str(own))
        assert resolve_binding(args, choice) == []
        for cmd in commands(tmp_path, args):
            assert flag(cmd, "--binding-profile") == str(own.resolve())


def test_a_missing_binding_profile_is_refused_by_name(tmp_path):
    args = parse("--binding-profile", str(tmp_path / "nope.json"))
    assert resolve_binding(args, ControlChoice(True, SHIPPED)) == [
        f"--binding-profile {tmp_path / 'nope.json'}: no such file"
    ]


def test_a_profile_the_cost_model_cannot_read_is_refused_at_start(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": "nitsum-profile/1"}))
    args = parse("--binding-profile", str(bad))
    errors = resolve_binding(args, ControlChoice(True, SHIPPED))
    assert len(errors) == 1 and errors[0].startswith(f"--binding-profile {bad}: "), errors
    assert args.binding_profile == str(bad)  # not resolved: serve stops here


def test_the_configs_profile_is_the_control_profile_when_no_flag_names_one(tmp_path):
    config = tmp_path / "router.json"
    config.write_text(json.dumps({"profile": str(SHIPPED)}))
    args = parse("--config", str(config))
    # The router takes the config's profile itself: serve passes it no --profile.
    assert resolve_binding(args, ControlChoice(True, None)) == []
    assert args.binding_profile == str(SHIPPED)


def test_a_bad_policy_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit):
        parse("--bind-policy", "sometimes")
    assert "--bind-policy: invalid choice: 'sometimes'" in capsys.readouterr().err


# `nitsum serve` itself, with a fake router that takes --profile and workers that record their
# real command lines (test_worker_serve.py's fakes).
RECORDING = """
import json, sys, nitsum.serve as s
fake, out = sys.argv[1], sys.argv[2]
real = s.worker_command
def record(i, d, addr, n, args):
    json.dump(real(i, d, addr, n, args), open(f"{out}/cmd{i}.json", "w"))
    return [sys.executable, fake, str(i), addr, out, "ok"]
s.worker_command = record
sys.exit(s.main(sys.argv[3:]))
"""


@pytest.mark.e2e
@pytest.mark.parametrize("control", [True, False])
def test_serve_passes_the_profile_it_gives_the_router(tmp_path, control):
    router = tmp_path / "fake-router"
    source = FAKE_ROUTER.replace('"--config")', '"--config", "--profile")')
    assert source != FAKE_ROUTER, "the fake router's flags changed: teach it --profile again"
    router.write_text(f"#!{sys.executable}\n{source}")
    router.chmod(0o755)
    (tmp_path / "fake_worker.py").write_text(FAKE_WORKER)
    argv = ["--model", str(model_dir(tmp_path)), "--workers", "1", "--port", str(free_port())]
    argv += ["--worker-addr", f"tcp://127.0.0.1:{free_port()}", "--router-bin", str(router)]
    argv += ["--stop-timeout", "1", "--startup-timeout", "30"]
    argv += ["--profile", str(SHIPPED)] if control else ["--no-control"]
    env = {**os.environ, "FAKE_OUT": str(tmp_path), "PYTHONPATH": str(ROOT / "python")}
    cmd = [sys.executable, "-c", RECORDING, str(tmp_path / "fake_worker.py"), str(tmp_path)]
    proc = subprocess.Popen([*cmd, *argv], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "... ready at ..." once the worker registered
        assert "ready at" in line, line
    finally:
        proc.terminate()
        proc.wait(15)
        if proc.stdout is not None:
            proc.stdout.close()
        # NOTE: serve stopped its children; any left over (a stubborn one) goes by its pid.
        pids = [int(f.read_text()) for f in tmp_path.glob("*.pid")]
        if (tmp_path / "router.json").exists():
            pids.append(json.loads((tmp_path / "router.json").read_text())["pid"])
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    router_argv = json.loads((tmp_path / "router.json").read_text())["argv"]
    worker_cmd = json.loads((tmp_path / "cmd0.json").read_text())
    if control:
        assert flag(router_argv, "--profile") == str(SHIPPED)
        assert flag(worker_cmd, "--binding-profile") == str(SHIPPED)
    else:
        assert "--profile" not in router_argv and "--binding-profile" not in worker_cmd
