"""What drives an engine's steps instead of its synchronous path (engine/overlap.py)."""

from __future__ import annotations

from typing import Protocol

from nitsum.engine.request_output import RequestOutput
from nitsum.engine.scheduled import Scheduled


class StepDriver(Protocol):
    """Another way to run the engine's steps (engine/overlap.py: the host prepares the next
    step while the device runs this one)."""

    def step(self) -> list[RequestOutput]:
        """One iteration; the new tokens of every sequence whose sampled token is known."""
        ...

    def settle(self) -> None:
        """Wait until the device runs nothing of this engine (before pages are freed)."""
        ...

    # Seconds the host has waited for the device's tokens so far, and the batch whose
    # tokens the last `step` applied (the step log, engine/step_log.py).
    waited_s: float
    last_applied: list[Scheduled]
