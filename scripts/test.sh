#!/usr/bin/env bash
# Every test: lints (scripts/lint.sh), Rust unit/integration tests, then pytest (unit +
# end-to-end on CPU devices; tests/ and the kernels package's kernels/tests/). Other
# arguments go to pytest.
#
# `--fast`: the Python unit tests only (no lints, no cargo; pytest -m "not slow and not e2e":
# nothing that loads the real model or spawns processes), a few minutes on 2 cores.
# Expects `bash scripts/setup.sh --test` to have run.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == "--fast" ]]; then
    shift
    exec .venv/bin/python -m pytest -q tests kernels/tests -m "not slow and not e2e" "$@"
fi
bash scripts/lint.sh
cargo test -q --release -p nitsum-scheduler
.venv/bin/python -m pytest -q tests kernels/tests "$@"
