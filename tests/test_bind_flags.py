"""The binding cost model's knobs (issue 32): `--binding-profile` / `--bind-policy` reach the
worker's EngineConfig, with "cost" and no profile by default; a wrong policy is refused."""

from __future__ import annotations

import pytest

from nitsum.engine.engine_config import EngineConfig
from nitsum.worker.__main__ import build_parser as worker_parser
from nitsum.worker.__main__ import engine_config

BASE = ["--model", "m", "--router", "tcp://x:1", "--worker-id", "0"]


def test_worker_flags_reach_the_engine_config() -> None:
    ecfg = engine_config(worker_parser().parse_args(BASE))
    assert (ecfg.binding_profile, ecfg.bind_policy) == (None, "cost")
    args = [*BASE, "--binding-profile", "/p/h100.json", "--bind-policy", "always"]
    ecfg = engine_config(worker_parser().parse_args(args))
    assert (ecfg.binding_profile, ecfg.bind_policy) == ("/p/h100.json", "always")


def test_a_wrong_bind_policy_is_refused() -> None:
    with pytest.raises(SystemExit):
        worker_parser().parse_args([*BASE, "--bind-policy", "sometimes"])
    with pytest.raises(ValueError, match="bind_policy"):
        EngineConfig(bind_policy="sometimes")
