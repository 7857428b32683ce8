#!/usr/bin/env bash
# Lints, part of the README's test command: ruff (lint + format) on the Python side,
# rustfmt and clippy (warnings are errors) on the Rust side. Fixes: `ruff check --fix`,
# `ruff format`, `cargo fmt --all`.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check python tests scripts
.venv/bin/ruff format --check python tests scripts
cargo fmt --all -- --check
cargo clippy --release -q --all-targets -- -D warnings
echo "lints clean"
