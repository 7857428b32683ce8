"""Regenerate the golden router ↔ worker fixtures (tests/golden/wire/) from tests/wire_golden.py.

Run it only for a deliberate protocol change, on both sides at once: the fixtures pin the wire
for tests/test_wire_golden.py (the Python dataclasses) and scheduler-rs `protocols/
wire_golden/` (the router's Rust types), so a change made on one side only fails them.

    PYTHONPATH=python python scripts/regen_wire_fixtures.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from wire_golden import write_all  # noqa: E402


def main() -> None:
    for path in write_all():
        print(path)


if __name__ == "__main__":
    main()
