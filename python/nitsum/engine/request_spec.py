"""What a request asks of the worker besides its tokens: one frozen `RequestSpec`.

The router's `generate` message (engine/generate_message.py, decoded by the one codec) becomes
it once (`Generate.spec`), the engines take it whole, and a `Sequence` keeps it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nitsum.errors import InvalidRequestError
from nitsum.sampling import SamplingParams

# Local-scheduler classes, in the order the batch is filled (architecture §3, Nitsum §3.3.2).
CLASSES = ("feasible", "best_effort", "background")


@dataclass(frozen=True)
class RequestSpec:
    """Per-request metadata: how to sample, whom the request belongs to and how the local
    scheduler treats it. Immutable: a scheduler's own view (e.g. a demoted class) lives on
    the `Sequence`.

    NOTE: the request id and the prompt stay outside: the id names the request everywhere
    (engines key on it) and the prompt is data the engines extend and trim, not a setting.
    """

    sampling: SamplingParams = field(default_factory=SamplingParams)
    tier: str = ""
    # The local-scheduler class (`CLASSES`); the wire calls it `class`.
    slo_class: str = "feasible"
    # The tier's TTFT target: a request not started within it is served last.
    ttft_ms: float | None = None
    # The tier's TPOT target and goodput weight: what the binding cost model weighs the
    # request's decode and its worth against the requests a binding delays (pool/bind_choice.py).
    tpot_ms: float | None = None
    weight: float = 1.0
    # Lower is served first within its class (vLLM's `priority` convention).
    priority: int = 0
    # May preempt running requests of a lower class or priority to get in.
    may_preempt: bool = True
    # Run on a TP group of this size bound for the request (its tier's `bind_tp`).
    bind_tp: int | None = None
    # Whether that binding waits for its group (hard) or may run on a replica meanwhile
    # (soft); None: hard when the request has a TTFT target. Not on the wire.
    bind_hard: bool | None = None
    # The first of n > 1 choices of the same prompt: share its prefill (engine/forks.py).
    fork_of: str | None = None
    # P/D: the decode group's leader (a router worker id) to hand the KV to after prefill.
    decode_target: int | None = None
    # vLLM's `truncate_prompt_tokens`: serve only the last k prompt tokens (left
    # truncation); None: the whole prompt.
    truncate_prompt_tokens: int | None = None

    # vLLM's `cache_salt`: only requests with the same salt share prefix-cached KV.
    cache_salt: str | None = None

    def __post_init__(self) -> None:
        if self.slo_class not in CLASSES:
            raise InvalidRequestError("class", f"must be one of {CLASSES}, got {self.slo_class!r}")

    def prompt(self, prompt_ids: list[int]) -> list[int]:
        """The prompt the request is served with (`truncate_prompt_tokens` applied)."""
        k = self.truncate_prompt_tokens
        return list(prompt_ids if k is None else prompt_ids[-k:])
