#!/usr/bin/env bash
# Every test: lints (scripts/lint.sh), Rust unit/integration tests, then pytest (unit +
# end-to-end on CPU devices).
# Expects `bash scripts/setup.sh --test` to have run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/lint.sh
cargo test -q --release -p nitsum-scheduler
.venv/bin/python -m pytest -q tests "$@"
