"""What a request asks of the worker besides its tokens: one frozen `RequestSpec`.

The router's `generate` message is parsed into it once (worker/inbound.py), the engines take
it whole, and a `Sequence` keeps it. Each field declares its own wire check (`wire_field`), so
`from_wire` validates every field without a per-field parser: a new per-request knob is its
declaration here, the router's wire field, and the code that uses it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from nitsum.errors import InvalidRequestError
from nitsum.sampling import SamplingParams

# Local-scheduler classes, in the order the batch is filled (architecture §3, Nitsum §3.3.2).
CLASSES = ("feasible", "best_effort", "background")


def is_int(x: object) -> bool:
    """A wire integer (msgpack's bool is not one)."""
    return isinstance(x, int) and not isinstance(x, bool)


def is_num(x: object) -> bool:
    """A wire number, integer or float (not a bool)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)


@dataclass(frozen=True)
class WireCheck:
    """How a `generate` message carries a `RequestSpec` field: under `key` (None: the
    field's name), valid when `ok(value)` (else InvalidRequestError "must be {what}"),
    stored as `convert(value)` (None: as it is)."""

    key: str | None
    ok: Callable[[object], bool]
    what: str
    convert: Callable[[Any], Any] | None = None


def wire_field(
    default: Any,
    ok: Callable[[object], bool],
    what: str,
    key: str | None = None,
    convert: Callable[[Any], Any] | None = None,
) -> Any:
    """A dataclass field with a default that the wire may set (`key`: the field's name
    unless given). NOTE: an absent key keeps the default; a present `null` is checked."""
    return field(default=default, metadata={"wire": WireCheck(key, ok, what, convert)})


def _optional(ok: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda x: x is None or ok(x)


def _positive_int(x: object) -> bool:
    return is_int(x) and x >= 1  # type: ignore[operator]


@dataclass(frozen=True)
class RequestSpec:
    """Per-request metadata: how to sample, whom the request belongs to and how the local
    scheduler treats it. Immutable: a scheduler's own view (e.g. a demoted class) lives on
    the `Sequence`.

    NOTE: the request id and the prompt stay outside: the id names the request everywhere
    (engines key on it) and the prompt is data the engines extend and trim, not a setting.
    """

    sampling: SamplingParams = field(default_factory=SamplingParams)
    tier: str = wire_field("", lambda x: isinstance(x, str), "a string")
    # The local-scheduler class (`CLASSES`); the wire calls it `class`.
    klass: str = wire_field("feasible", lambda x: x in CLASSES, f"one of {CLASSES}", key="class")
    # The tier's TTFT target: a request not started within it is served last.
    ttft_ms: float | None = wire_field(
        None,
        _optional(lambda x: is_num(x) and x > 0),  # type: ignore[operator]
        "a positive number or null",
        convert=lambda x: None if x is None else float(x),
    )
    # The tier's TPOT target and goodput weight: what the binding cost model weighs the
    # request's decode and its worth against the requests a binding delays (pool/bind_choice.py).
    tpot_ms: float | None = wire_field(
        None,
        _optional(lambda x: is_num(x) and x > 0),  # type: ignore[operator]
        "a positive number or null",
        convert=lambda x: None if x is None else float(x),
    )
    weight: float = wire_field(
        1.0,
        lambda x: is_num(x) and x > 0,  # type: ignore[operator]
        "a positive number",
        convert=float,
    )
    # Lower is served first within its class (vLLM's `priority` convention).
    priority: int = wire_field(0, is_int, "an integer")
    # May preempt running requests of a lower class or priority to get in.
    may_preempt: bool = wire_field(True, lambda x: isinstance(x, bool), "a boolean", key="preempt")
    # Run on a TP group of this size bound for the request (its tier's `bind_tp`).
    bind_tp: int | None = wire_field(None, _optional(_positive_int), "a positive integer")
    # Whether that binding waits for its group (hard) or may run on a replica meanwhile
    # (soft); None: hard when the request has a TTFT target. Not on the wire.
    bind_hard: bool | None = None
    # The first of n > 1 choices of the same prompt: share its prefill (engine/forks.py).
    fork_of: str | None = wire_field(
        None, _optional(lambda x: isinstance(x, str) and bool(x)), "a request id or null"
    )
    # P/D: the decode group's leader (a router worker id) to hand the KV to after prefill.
    decode_target: int | None = wire_field(None, _optional(is_int), "an integer or null")
    # vLLM's `truncate_prompt_tokens`: serve only the last k prompt tokens (left
    # truncation); None: the whole prompt.
    truncate_prompt_tokens: int | None = wire_field(
        None, _optional(_positive_int), "a positive integer or null"
    )

    # vLLM's `cache_salt`: only requests with the same salt share prefix-cached KV.
    cache_salt: str | None = wire_field(
        None, _optional(lambda x: isinstance(x, str) and bool(x)), "a non-empty string or null"
    )

    def __post_init__(self) -> None:
        if self.klass not in CLASSES:
            raise InvalidRequestError("class", f"must be one of {CLASSES}, got {self.klass!r}")

    def prompt(self, prompt_ids: list[int]) -> list[int]:
        """The prompt the request is served with (`truncate_prompt_tokens` applied)."""
        k = self.truncate_prompt_tokens
        return list(prompt_ids if k is None else prompt_ids[-k:])

    @classmethod
    def from_wire(cls, msg: dict[str, Any], sampling: SamplingParams) -> RequestSpec:
        """The spec a `generate` message carries, every field checked by its declaration;
        InvalidRequestError names the first bad one."""
        values: dict[str, Any] = {"sampling": sampling}
        for f in fields(cls):
            if "wire" not in f.metadata:
                continue
            check: WireCheck = f.metadata["wire"]
            key = check.key or f.name
            if key not in msg:
                continue
            value = msg[key]
            if not check.ok(value):
                raise InvalidRequestError(key, f"must be {check.what}, got {value!r}")
            values[f.name] = check.convert(value) if check.convert is not None else value
        return cls(**values)

    def to_wire(self) -> dict[str, Any]:
        """Every wire field by its wire key (`from_wire`'s inverse; sampling excluded)."""
        return {
            f.metadata["wire"].key or f.name: getattr(self, f.name)
            for f in fields(self)
            if "wire" in f.metadata
        }

    @classmethod
    def wire_keys(cls) -> dict[str, Any]:
        """Wire key -> default of every field the wire may set (docs and tests)."""
        out = {}
        for f in fields(cls):
            if "wire" in f.metadata:
                assert f.default is not MISSING
                out[f.metadata["wire"].key or f.name] = f.default
        return out
