"""One sequence's share of a step, as the scheduler hands it to the runner."""

from __future__ import annotations

from dataclasses import dataclass

from nitsum.engine.sequence import Sequence


@dataclass
class Scheduled:
    """One sequence's share of a step: `q_len` tokens from `start`; sample after if `sample`."""

    seq: Sequence
    start: int
    q_len: int

    @property
    def sample(self) -> bool:
        return self.start + self.q_len == self.seq.total_len
