"""`python -m nitsum.bench ...` runs `nitsum bench ...` until the `nitsum` CLI wires it in."""

import sys

from nitsum.bench.bench_cli import main

sys.exit(main())
