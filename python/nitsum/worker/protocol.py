"""Router ↔ worker messages (docs/protocol.md, v1), one frozen dataclass per `type`.

The codec (nitsum/codec.py) turns them into msgpack maps and back: `Msg(...).to_wire()` to send,
`Msg.from_wire(decode(frame))` to read one, with its fields type-checked. `generate` is declared
on the engine floor (engine/generate_message.py: a KV handoff carries it too) and becomes the
engine's request in `inbound.parse_generate`; `stats` is in stats.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from nitsum.codec import PROTOCOL_VERSION as PROTOCOL_VERSION
from nitsum.codec import Message, wire_field
from nitsum.codec import ProtocolError as ProtocolError
from nitsum.codec import decode as decode
from nitsum.codec import encode as encode
from nitsum.engine.generate_message import Generate as Generate
from nitsum.engine.request_spec import RequestSpec
from nitsum.sampling import SamplingParams
from nitsum.sampling_logprobs import TokenLogprob

SECRET_ENV = "NITSUM_WORKER_SECRET"  # the shared worker secret (docs/security.md)
FinishReason = Literal["stop", "length", "abort", "error"]
Role = Literal["prefill", "decode", "mixed"]
FINISH_REASONS: tuple[str, ...] = get_args(FinishReason)
ROLES: tuple[str, ...] = get_args(Role)


def _positive(x: int | None) -> bool:
    return x is None or x >= 1


AT_LEAST_ONE = (_positive, "an integer >= 1")


# -- worker → router ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Hello(Message):
    """A worker with a secret opens the handshake (handshake.py): its own 64-hex `nonce`."""

    TYPE = "hello"
    worker_id: int
    handshake: int
    nonce: str


@dataclass(frozen=True)
class Register(Message):
    """A worker introduces itself (with `auth` when answering a `challenge`).

    `domain`: the worker ids that can form TP groups and hand KV to each other share it;
    `auth`: the handshake proof (`proof`); `kv_transport`: the rendezvous address of the KV
    transport between host worker processes this one joined (pool/peers.py)."""

    TYPE = "register"
    worker_id: int
    device: str
    model: str
    tp_levels: list[int]
    domain: int
    kv_capacity_tokens: int
    max_context: int
    eos_token_ids: list[int]
    auth: str | None = wire_field(omit=None, default=None)
    kv_transport: str | None = wire_field(omit=None, default=None)


@dataclass(frozen=True)
class Heartbeat(Message):
    """Liveness and load of one worker id."""

    TYPE = "heartbeat"
    worker_id: int
    running: int
    waiting: int
    free_pages: int
    epoch: int


@dataclass(frozen=True)
class Tokens(Message):
    """New token ids of one request; the last message of a request has a `finish_reason`.

    `queue_ms` (with a request's first tokens): how long it waited before its first step.
    `logprobs` (one per token id, when the request asked). `error_param` (with `error`): the
    request field the worker refused, so the client gets a 400 naming it rather than a 500.
    `prompt_logprobs` (with the first token, when asked): the prompt tokens' after the first.
    `cached_tokens` (with the first token): prompt tokens found in the prefix cache.
    """

    TYPE = "tokens"
    worker_id: int
    request_id: str
    token_ids: list[int]
    finish_reason: FinishReason | None
    error: str | None
    prompt_tokens: int
    queue_ms: float | None = wire_field(omit=None, default=None)
    logprobs: list[TokenLogprob] | None = wire_field(omit=None, default=None)
    error_param: str | None = wire_field(omit=None, default=None)
    prompt_logprobs: list[TokenLogprob] | None = wire_field(omit=None, default=None)
    cached_tokens: int | None = wire_field(omit=None, default=None)

    def __post_init__(self) -> None:
        # NOTE: the router ends a request on any non-null reason: a typo would end it silently.
        assert self.finish_reason is None or self.finish_reason in FINISH_REASONS, self


@dataclass(frozen=True)
class DeviceLost(Message):
    """Device `worker_id` of a host worker died (its process exited): the router takes it out
    of the plan and resumes its requests elsewhere at once, as for a missed heartbeat. It
    comes back with a `register` once the host worker restarted it.

    NOTE: sent on the dead device's own socket after its last `tokens`, so the router has
    every token it streamed when it resumes its requests."""

    TYPE = "device_lost"
    worker_id: int
    reason: str


@dataclass(frozen=True)
class Reconfigured(Message):
    """The ack of a `reconfigure`, on the socket it came on."""

    TYPE = "reconfigured"
    worker_id: int
    epoch: int
    ok: bool
    error: str | None
    timings_ms: dict[str, float]


# -- router → worker ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Challenge(Message):
    """The answer to `hello`: the router's `nonce` (64 hex chars) and its `proof` of the secret
    (handshake.py); a worker checks it, then proves the secret in `register.auth`."""

    TYPE = "challenge"
    worker_id: int
    handshake: int
    nonce: str
    proof: str


@dataclass(frozen=True)
class Refused(Message):
    """The router did not accept a `register`, and why."""

    TYPE = "refused"
    worker_id: int
    error: str


@dataclass(frozen=True)
class Registered(Message):
    """The router accepted a `register`; `epoch` is its plan's."""

    TYPE = "registered"
    worker_id: int
    epoch: int = 0


@dataclass(frozen=True)
class Reregister(Message):
    """The router does not know this worker (it declared it dead): register again at once."""

    TYPE = "reregister"


@dataclass(frozen=True)
class Abort(Message):
    """End a request (a no-op when it is unknown or finished)."""

    TYPE = "abort"
    request_id: str = wire_field(check=(bool, "a non-empty string"))


@dataclass(frozen=True)
class GroupPlan:
    """One group of a `reconfigure` plan as the router planned it (Rust `plan.rs` GroupPlan):
    `tp · pp` members (router worker ids), stage-major, with its role, tiers and batch cap.

    NOTE: the worker turns it into a `parallel.topology.GroupShape` (local device ids, the key
    of its engine) once, in `worker/assignment.py`; `kv.pages.GroupPages` is that group's view
    of the page allocator."""

    members: list[int] = wire_field(check=(bool, "a non-empty list of worker ids"))
    tp: int = wire_field(check=AT_LEAST_ONE)
    role: Role = "mixed"
    tiers: list[str] = field(default_factory=list)
    accepts_background: bool = True
    # The local scheduler's batch cap (None: the worker's own limit).
    max_batch: int | None = wire_field(omit=None, default=None, check=AT_LEAST_ONE)
    pp: int = wire_field(omit=1, default=1, check=AT_LEAST_ONE)


@dataclass(frozen=True)
class Reconfigure(Message):
    """The whole new plan; a worker acts on the groups that contain it."""

    TYPE = "reconfigure"
    epoch: int
    groups: list[GroupPlan]


@dataclass(frozen=True)
class FlushCache(Message):
    """Drop the prefix caches' pages no running request holds (`/flush_cache`)."""

    TYPE = "flush_cache"


@dataclass(frozen=True)
class Shutdown(Message):
    """Stop: end the live requests with an error and exit."""

    TYPE = "shutdown"


# Router → worker messages by `type`, but `generate` (`inbound.parse_generate`).
ROUTER_MESSAGES: dict[str, type[Message]] = {
    m.TYPE: m
    for m in (Challenge, Refused, Registered, Reregister, Abort, Reconfigure, FlushCache, Shutdown)
}


def generate(
    request_id: str,
    input_ids: list[int],
    sampling: SamplingParams,
    tier: str = "",
    slo_class: str = "feasible",
    decode_target: int | None = None,
) -> dict[str, Any]:
    """A `generate` as the router sends it (tests and tools; the router builds its own)."""
    spec = RequestSpec(sampling, tier=tier, slo_class=slo_class, decode_target=decode_target)
    return Generate.of(request_id, input_ids, spec).to_wire()
