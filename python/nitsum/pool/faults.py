"""Failures a test injects into a TP switch: one `FaultPlan`, which production never passes.

NOTE: production code takes `faults: FaultPlan | None = None` and treats None as "no
failures"; the checks below are the only places a fault is acted on.
"""

from __future__ import annotations

from dataclasses import dataclass

# Phases of a switch a fault may fail (pool/switch.py); "after_commit" fails once it stands.
PHASES = ("plan", "capacity", "transfer", "commit", "after_commit")


class SwitchFault(RuntimeError):
    """A failure injected into a phase of a switch (tests)."""


@dataclass(frozen=True)
class FaultPlan:
    """`transfer = (piece index, chunk)`: both ends of that migration piece stop after `chunk`
    chunks and the transfer fails (kv_transfer.py); `phase`: that phase of the switch raises
    SwitchFault."""

    transfer: tuple[int, int] | None = None
    phase: str | None = None

    def __post_init__(self) -> None:
        if self.phase is not None and self.phase not in PHASES:
            raise ValueError(f"unknown switch phase {self.phase!r}; one of {PHASES}")

    def stop_chunk(self, piece_index: int) -> int | None:
        """After how many chunks piece `piece_index` stops (None: it completes)."""
        if self.transfer is not None and self.transfer[0] == piece_index:
            return self.transfer[1]
        return None

    def check(self, phase: str) -> None:
        """Raise SwitchFault when this plan fails `phase`."""
        if self.phase == phase:
            raise SwitchFault(f"failure injected in phase {phase!r}")
