#!/usr/bin/env bash
# Planner decision time at 128 devices x 4 tiers and 1024 x 8 (architecture §8).
# Usage: scripts/bench_planner.sh [--smoke] [PROFILE.json]  (--smoke: 1/50 of the iterations)
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo run --quiet --release -p nitsum-scheduler --example bench_planner -- "$@"
