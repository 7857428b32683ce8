"""`/openapi.json` checked against the server: schemathesis (a property-based API fuzzer)
sends requests generated from the spec to the `nitsum-router` binary with a mock worker and
the tiny model, and checks every answer: no 5xx, a documented status, a documented content
type, a body that matches the documented schema. Bounded: a few examples per operation, one
worker, under a minute.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from test_router_launch_flags import router, until_ready
from test_router_protocol import BIN, write_tiny_model

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not BIN.exists(), reason=f"{BIN} not built"),
]

CHECKS = (
    "not_a_server_error,status_code_conformance,content_type_conformance,"
    "response_schema_conformance"
)
# Examples per operation in the fuzzing phase (the coverage phase adds its own: about 2,000
# requests in all, ~25 s on 2 cores).
EXAMPLES = 12
LIMIT_S = 90


def schemathesis_cli() -> list[str]:
    found = shutil.which("st") or shutil.which("schemathesis")
    beside = Path(sys.executable).parent / "st"
    if beside.exists():
        return [str(beside)]
    if found:
        return [found]
    pytest.skip("schemathesis is not installed (pip install -e '.[test]')")
    raise AssertionError


def test_docs_page_and_spec_are_served(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    write_tiny_model(tmp_path / "m")
    with router(tmp_path) as (port, _log):
        http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
        spec = http.get("/openapi.json").json()
        assert spec["openapi"].startswith("3.")
        ops = [(m, p) for p, item in spec["paths"].items() for m in item]
        assert len(ops) == 25, sorted(ops)
        assert "swagger-ui" in http.get("/docs").text
        chat = spec["components"]["schemas"]["ChatCompletionRequest"]
        assert "m" in str(chat)  # the served model's name is the enum of `model`


def test_the_fuzzer_finds_no_5xx_and_no_schema_violation(tmp_path: Path) -> None:
    st = schemathesis_cli()
    (tmp_path / "m").mkdir()
    write_tiny_model(tmp_path / "m")
    with router(tmp_path) as (port, log):
        base = f"http://127.0.0.1:{port}"
        until_ready(httpx.Client(base_url=base, timeout=30), "/health")
        cmd = [*st, "run", f"{base}/openapi.json", "--checks", CHECKS]
        cmd += ["--max-examples", str(EXAMPLES), "--workers", "1", "--no-color"]
        cmd += ["--phases", "examples,coverage,fuzzing", "--request-timeout", "20"]
        t0 = time.monotonic()
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=LIMIT_S, cwd=tmp_path)
        took = time.monotonic() - t0
        out = run.stdout + run.stderr
        print(out[-6000:])
        assert "panicked" not in log.read_text()
        assert run.returncode == 0, out[-6000:]
        assert took < LIMIT_S
        # NOTE: a run that tested nothing must not pass: every operation, many cases.
        # NOTE: schemathesis counts 24 of the spec's 25 operations (a route added to the spec
        # raises both): every one it counts is selected and tested.
        selected = re.search(r"Selected: (\d+)/(\d+)", out) or re.search(
            r"(\d+) selected / (\d+) total", out
        )
        assert selected and selected[1] == selected[2] == "24", out[-3000:]
        generated = re.search(r"(\d+) generated, (\d+) passed", out)
        assert generated and int(generated[1]) >= 500 and generated[1] == generated[2], out[-3000:]
