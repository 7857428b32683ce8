"""Cuts in a recorded step where a collective cannot be captured.

A CUDA graph records device work only. A collective that synchronizes through the host
(parallel/shared_collectives.py: device processes sharing one GPU) cannot be inside one, so a
recording in progress (engine/graphs.py `Recording`) installs a cut here: such a collective
hands it the call to make at replay instead of running, the recording closes the graph
captured so far, keeps the call, and opens the next graph. A replay then runs graph, call,
graph, call, ... graph. Collectives that can be captured (NCCL) never ask.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

Cut = Callable[[Callable[[], None]], None]

_active: list[Cut] = []


def active() -> Cut | None:
    """The cut of the recording in progress in this process, if any."""
    return _active[-1] if _active else None


@contextmanager
def cutting(cut: Cut) -> Iterator[None]:
    """While recording: collectives that cannot be captured call `cut(call)`."""
    _active.append(cut)
    try:
        yield
    finally:
        _active.pop()
