#!/usr/bin/env bash
# Router benchmark: dispatch throughput with 128 instant mock workers and 50,000 pre-tokenized
# requests, and router-added latency at 1k req/s, on the in-process engine+ZeroMQ path and on
# the full HTTP path. Extra arguments go to the benchmark (see `--help`), e.g. --no-http.
# Writes the last line of output (JSON summary) to results/bench_router.json, or to
# $BENCH_ROUTER_OUT (the smoke test's, tests/test_scripts_smoke.py).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${BENCH_ROUTER_OUT:-results/bench_router.json}"
cargo build --release --example bench_router
mkdir -p "$(dirname "$out")"
./target/release/examples/bench_router "$@" | tee /dev/stderr | sed -n 's/^summary: //p' > "$out"
