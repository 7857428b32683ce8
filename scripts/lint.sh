#!/usr/bin/env bash
# Lints, part of the README's test command: ruff (lint + format) on every Python file in the
# repository (and the Python blocks in docs/), mypy on the packages (python/nitsum and
# kernels/nitsum_kernels), rustfmt and clippy (warnings are errors) on the Rust side.
# Fixes: `ruff check --fix .`, `ruff format .`, `cargo fmt --all`.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy python/nitsum kernels/nitsum_kernels
cargo fmt --all -- --check
cargo clippy --release -q --all-targets -- -D warnings
echo "lints clean"
