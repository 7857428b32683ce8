"""Every command in the README's table answers `--help` with no optional extra installed
(issue 40 item 9): after the README's first command alone (`bash scripts/setup.sh`, no
`[test]`), `nitsum bench --help` died with `ModuleNotFoundError: matplotlib`, and CI, which
installs `test`, never noticed.

A fresh interpreter gets a `sys.meta_path` finder that refuses every package of every optional
extra (those the base dependencies do not also bring), then runs each command's `--help`.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e  # a subprocess

REPO = Path(__file__).resolve().parent.parent

RUNNER = r"""
import contextlib, importlib.abc, io, json, sys

BLOCKED = set(json.loads(sys.argv[1]))
COMMANDS = json.loads(sys.argv[2])


class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (optional extra blocked)")
        return None


sys.meta_path.insert(0, Refuse())
out = {}
for argv in COMMANDS:
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            if argv[0] == "nitsum-router":
                from nitsum._core import router_main

                rc = router_main([*argv, "--help"])
            else:
                from nitsum.cli import main

                rc = main([*argv[1:], "--help"])
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    except Exception as e:
        rc = f"{type(e).__name__}: {e}"
    out[" ".join(argv)] = [rc, buf.getvalue()[-300:]]
print(json.dumps(out))
"""


def _requirement_name(req: str) -> str:
    return re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0].strip().lower()


def optional_packages() -> list[str]:
    """Import names of the packages only an optional extra brings."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    base = {_requirement_name(r) for r in project["dependencies"]}
    extras = {
        _requirement_name(r) for reqs in project["optional-dependencies"].values() for r in reqs
    }
    return sorted(name.replace("-", "_") for name in extras - base)


def readme_commands() -> list[list[str]]:
    """The commands of the README's table (`nitsum serve`, `nitsum model prepare`, ...)."""
    text = (REPO / "README.md").read_text()
    table = text.split("## Commands", 1)[1].split("\n## ", 1)[0]
    return [m.split() for m in re.findall(r"^\| `(nitsum[^`]*)` \|", table, re.M)]


def test_the_readme_lists_the_commands_and_the_extras_hold_plotting() -> None:
    commands = readme_commands()
    assert ["nitsum", "bench"] in commands and ["nitsum-router"] in commands, commands
    assert {"matplotlib", "pytest", "transformers"} <= set(optional_packages())


def test_every_command_answers_help_without_any_optional_extra() -> None:
    blocked, commands = optional_packages(), readme_commands()
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER, json.dumps(blocked), json.dumps(commands)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    failed = {cmd: res for cmd, res in results.items() if res[0] != 0}
    assert not failed, f"with {blocked} blocked: {failed}"
    assert set(results) == {" ".join(c) for c in commands}
