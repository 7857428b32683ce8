#!/usr/bin/env bash
# Router benchmark: dispatch throughput with 128 instant mock workers and 50,000 pre-tokenized
# requests, and router-added latency at 1k req/s, on the in-process engine+ZeroMQ path and on
# the full HTTP path. Extra arguments go to the benchmark (see `--help`), e.g. --no-http.
# Writes the last line of output (JSON summary) to results/bench_router.json.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --example bench_router
mkdir -p results
./target/release/examples/bench_router "$@" | tee /dev/stderr | sed -n 's/^summary: //p' > results/bench_router.json
