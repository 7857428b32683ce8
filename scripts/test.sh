#!/usr/bin/env bash
# Every test: Rust unit/integration tests, then pytest (unit + end-to-end on CPU devices).
# Expects `bash scripts/setup.sh --test` to have run.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test -q --release -p nitsum-scheduler
.venv/bin/python -m pytest -q tests "$@"
