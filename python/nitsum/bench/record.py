"""What the replay client measured for one request, and the latencies derived from it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(slots=True)
class RequestRecord:
    """Timings of one replayed request, in seconds since the start of the run.

    NOTE: every request of a run gets exactly one record; `error` is set (and the request
    counts as not meeting its SLO) when it failed, timed out or was never sent.
    """

    index: int
    tier: str | None
    input_len: int
    output_len: int  # requested (max_tokens)
    scheduled_s: float  # when the trace says it arrives
    send_s: float | None = None  # when the HTTP request was started
    first_token_s: float | None = None
    last_token_s: float | None = None
    done_s: float | None = None
    n_out: int = 0  # output tokens: `usage.completion_tokens`, else token chunks counted
    chunk_times: list[float] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        """Completed without error and produced at least one token."""
        return self.error is None and self.first_token_s is not None and self.done_s is not None

    @property
    def ttft_s(self) -> float | None:
        """Time to first token: first token − send."""
        if not self.ok or self.send_s is None or self.first_token_s is None:
            return None
        return self.first_token_s - self.send_s

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first: (last − first) / (n_out − 1).

        With one output token there is no inter-token interval and TPOT is 0.
        """
        if not self.ok or self.first_token_s is None or self.last_token_s is None:
            return None
        if self.n_out < 2:
            return 0.0
        return (self.last_token_s - self.first_token_s) / (self.n_out - 1)

    @property
    def e2e_s(self) -> float | None:
        """End to end: completion − send."""
        if not self.ok or self.send_s is None or self.done_s is None:
            return None
        return self.done_s - self.send_s

    def to_json(self, chunk_times: bool = False) -> dict[str, Any]:
        """A JSON-able dict with the derived latencies; chunk times only when asked (they
        dominate the size of a results file)."""
        d = asdict(self)
        if not chunk_times:
            d.pop("chunk_times")
        d.update(ttft_s=self.ttft_s, tpot_s=self.tpot_s, e2e_s=self.e2e_s)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RequestRecord:
        """Inverse of `to_json` (derived fields are recomputed, not read)."""
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in names})
