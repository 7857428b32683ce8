"""`python -m nitsum.bench ...` runs `nitsum bench ...` until the `nitsum` CLI wires it in."""

import sys

from nitsum.bench.cli import main

sys.exit(main())
