"""matplotlib, imported only when a plot is drawn.

Plotting lives in the `bench` extra (and `test`): after the README's first command alone
(`bash scripts/setup.sh`, no extra) `nitsum bench` must still run and answer `--help`, and a
plot asked for without matplotlib is refused up front, naming the extra, before any run.
"""

from __future__ import annotations

from types import ModuleType

HINT = (
    "plotting needs matplotlib, in the `bench` extra: "
    "`.venv/bin/pip install -e '.[bench]'` (or `bash scripts/setup.sh --test`)"
)


class PlottingUnavailable(RuntimeError):
    """matplotlib is not installed."""


def pyplot() -> ModuleType:
    """`matplotlib.pyplot` on the Agg backend (no display needed); raises
    `PlottingUnavailable` (naming the extra) without matplotlib."""
    try:
        import matplotlib
    except ImportError as e:
        raise PlottingUnavailable(HINT) from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def require() -> None:
    """Raise `PlottingUnavailable` now unless plots can be drawn (call before a long run)."""
    pyplot()
