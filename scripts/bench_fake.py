"""Run `nitsum bench` against the in-process fake streaming server (no router needed).

    PYTHONPATH=python python scripts/bench_fake.py --ttft 0.05 --tpot 0.01 -- \
        --trace bursty --bursty-duration 10 --tiers strict:ttft=100,tpot=15 --out /tmp/r.json

Everything after `--` goes to `nitsum bench`; `--url` is filled in. Useful to check the
client side (send lag, CPU headroom) of a workload before pointing it at a real server.
"""

from __future__ import annotations

import argparse
import sys

from nitsum.bench.bench_cli import main as bench_main
from nitsum.bench.fake_server import FakeOpenAIServer


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    i = argv.index("--") if "--" in argv else len(argv)
    ours, rest = argv[:i], argv[i + 1 :]
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ttft", type=float, default=0.05, help="seconds before the first token")
    p.add_argument("--tpot", type=float, default=0.01, help="seconds between tokens")
    args = p.parse_args(ours)
    with FakeOpenAIServer(ttft_s=args.ttft, tpot_s=args.tpot) as srv:
        return bench_main(["--url", srv.url, "--plan-url", srv.url + "/admin/plan", *rest])


if __name__ == "__main__":
    sys.exit(main())
