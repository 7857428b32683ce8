"""Router ↔ worker messages (docs/protocol.md, v1): msgpack maps with `v` and `type`.

Builders return plain dicts (encode them with `encode`); parsers turn a received frame into a
dict or a typed request and raise with a message that names the bad field.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Any

import msgpack

from nitsum.engine.sequence import CLASSES
from nitsum.errors import InvalidRequestError
from nitsum.sampling import SamplingParams
from nitsum.sampling_logprobs import TokenLogprob
from nitsum.structured.spec import GrammarSpec

PROTOCOL_VERSION = 1
SECRET_ENV = "NITSUM_WORKER_SECRET"  # the shared worker secret (docs/security.md)
FINISH_REASONS = ("stop", "length", "abort", "error")
ROLES = ("prefill", "decode", "mixed")


class ProtocolError(ValueError):
    """A message that cannot be acted on at all (not a v1 map, or no usable request id)."""


# -- framing --------------------------------------------------------------------------------------
def encode(msg: dict[str, Any]) -> bytes:
    """One msgpack map per ZeroMQ frame."""
    return msgpack.packb(msg, use_bin_type=True)


def decode(frame: bytes) -> dict[str, Any]:
    """A received frame as a map with `v == 1` and a string `type`; ProtocolError otherwise."""
    try:
        msg = msgpack.unpackb(frame, raw=False)
    except Exception as e:  # msgpack raises several unrelated types on garbage
        raise ProtocolError(f"not msgpack: {e}") from e
    if not isinstance(msg, dict):
        raise ProtocolError(f"expected a map, got {type(msg).__name__}")
    if msg.get("v") != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {msg.get('v')!r} refused; this worker speaks v1")
    if not isinstance(msg.get("type"), str):
        raise ProtocolError("missing string field 'type'")
    return msg


def _msg(type_: str, **fields: Any) -> dict[str, Any]:
    return {"v": PROTOCOL_VERSION, "type": type_, **fields}


# -- worker → router ------------------------------------------------------------------------------
def register(
    worker_id: int,
    device: str,
    model: str,
    tp_levels: list[int],
    kv_capacity_tokens: int,
    max_context: int,
    eos_token_ids: list[int],
    domain: int | None = None,
    auth: str | None = None,
    kv_transport: str | None = None,
) -> dict[str, Any]:
    """`domain`: the worker ids that can form TP groups and hand KV to each other share it;
    `auth`: the handshake proof answering the router's `challenge` (see `proof`);
    `kv_transport`: the rendezvous address of the KV transport between host worker
    processes this one joined (pool/peers.py): domains that share it hand KV to each other."""
    extra: dict[str, Any] = {} if auth is None else {"auth": auth}
    if kv_transport is not None:
        extra["kv_transport"] = kv_transport
    return _msg(
        "register",
        worker_id=worker_id,
        device=device,
        model=model,
        tp_levels=list(tp_levels),
        domain=worker_id if domain is None else domain,
        kv_capacity_tokens=kv_capacity_tokens,
        max_context=max_context,
        eos_token_ids=list(eos_token_ids),
        **extra,
    )


def proof(secret: bytes, nonce_hex: str, worker_id: int, model: str) -> str:
    """The handshake proof (docs/protocol.md "Handshake"): hex HMAC-SHA256 under the shared
    secret of nonce ‖ worker id (u32 big-endian) ‖ model name (UTF-8)."""
    try:
        nonce = bytes.fromhex(nonce_hex)
    except (TypeError, ValueError) as e:
        raise ProtocolError(f"challenge: 'nonce' must be hex, got {nonce_hex!r}") from e
    if len(nonce) != 32 or not 0 <= worker_id < 2**32:
        raise ProtocolError(f"challenge: bad nonce length {len(nonce)} or worker id {worker_id}")
    body = nonce + worker_id.to_bytes(4, "big") + model.encode()
    return hmac.new(secret, body, hashlib.sha256).hexdigest()


def heartbeat(
    worker_id: int, running: int, waiting: int, free_pages: int, epoch: int
) -> dict[str, Any]:
    return _msg(
        "heartbeat",
        worker_id=worker_id,
        running=running,
        waiting=waiting,
        free_pages=free_pages,
        epoch=epoch,
    )


def stats(worker_id: int, values: dict[str, int | float]) -> dict[str, Any]:
    """Numeric counters the router exports as `nitsum_worker_stat` in `/metrics`."""
    return _msg("stats", worker_id=worker_id, **values)


def tokens(
    worker_id: int,
    request_id: str,
    token_ids: list[int],
    prompt_tokens: int,
    finish_reason: str | None = None,
    error: str | None = None,
    queue_ms: float | None = None,
    logprobs: list[TokenLogprob] | None = None,
) -> dict[str, Any]:
    """New token ids of one request; the last message of a request has a `finish_reason`.
    `queue_ms` (with a request's first tokens): how long it waited before its first step.
    With `logprobs` (one per token id, when the request asked): key `logprobs`, a list of
    `{"logprob": float, "top": [[id, logprob], ...]}`."""
    assert finish_reason is None or finish_reason in FINISH_REASONS, finish_reason
    extra: dict[str, Any] = {} if queue_ms is None else {"queue_ms": queue_ms}
    if logprobs is not None:
        extra["logprobs"] = [
            {"logprob": lp.logprob, "top": [[t, v] for t, v in lp.top]} for lp in logprobs
        ]
    return _msg(
        "tokens",
        worker_id=worker_id,
        request_id=request_id,
        token_ids=list(token_ids),
        finish_reason=finish_reason,
        error=error,
        prompt_tokens=prompt_tokens,
        **extra,
    )


def reconfigured(
    worker_id: int, epoch: int, ok: bool, error: str | None, timings_ms: dict[str, float]
) -> dict[str, Any]:
    return _msg(
        "reconfigured", worker_id=worker_id, epoch=epoch, ok=ok, error=error, timings_ms=timings_ms
    )


# -- router → worker (builders used by tests and fake routers) -------------------------------------
def registered(worker_id: int, epoch: int = 0) -> dict[str, Any]:
    return _msg("registered", worker_id=worker_id, epoch=epoch)


def challenge(worker_id: int, nonce_hex: str) -> dict[str, Any]:
    return _msg("challenge", worker_id=worker_id, nonce=nonce_hex)


def refused(worker_id: int, error: str) -> dict[str, Any]:
    return _msg("refused", worker_id=worker_id, error=error)


def generate(
    request_id: str,
    input_ids: list[int],
    sampling: SamplingParams | dict[str, Any],
    tier: str = "",
    klass: str = "feasible",
    decode_target: int | None = None,
) -> dict[str, Any]:
    grammar = sampling.grammar if isinstance(sampling, SamplingParams) else None
    if isinstance(sampling, SamplingParams):
        sampling = {
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,
            "seed": sampling.seed,
            "stop_token_ids": list(sampling.stop_token_ids),
            "ignore_eos": sampling.ignore_eos,
            "presence_penalty": sampling.presence_penalty,
            "frequency_penalty": sampling.frequency_penalty,
            "repetition_penalty": sampling.repetition_penalty,
            "logit_bias": [[t, b] for t, b in sampling.logit_bias],
            "min_tokens": sampling.min_tokens,
            "min_p": sampling.min_p,
            "logprobs": sampling.logprobs,
        }
    return _msg(
        "generate",
        request_id=request_id,
        input_ids=list(input_ids),
        sampling=sampling,
        tier=tier,
        decode_target=decode_target,
        **{"class": klass},
        **({} if grammar is None else {"grammar": grammar.to_wire()}),
    )


def abort(request_id: str) -> dict[str, Any]:
    return _msg("abort", request_id=request_id)


def reconfigure(epoch: int, groups: list[dict[str, Any]]) -> dict[str, Any]:
    return _msg("reconfigure", epoch=epoch, groups=groups)


def shutdown() -> dict[str, Any]:
    return _msg("shutdown")


# -- parsing router → worker ----------------------------------------------------------------------
def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _int_list(x: object) -> bool:
    return isinstance(x, list) and all(_is_int(t) for t in x)


def _bias_pairs(x: object) -> bool:
    return isinstance(x, list) and all(
        isinstance(p, list) and len(p) == 2 and _is_int(p[0]) and _is_num(p[1]) for p in x
    )


def request_id_of(msg: dict[str, Any]) -> str:
    """The `request_id` of a `generate`/`abort`; without one nobody can be answered."""
    rid = msg.get("request_id")
    if not isinstance(rid, str) or not rid:
        raise ProtocolError(f"{msg['type']}: 'request_id' must be a non-empty string, got {rid!r}")
    return rid


@dataclass(frozen=True)
class GenerateRequest:
    """A validated `generate` message."""

    request_id: str
    input_ids: list[int]
    sampling: SamplingParams
    tier: str
    klass: str
    decode_target: int | None
    ttft_ms: float | None = None
    priority: int = 0
    may_preempt: bool = True
    # Run on a TP group of this size bound for the request (its tier's `bind_tp`).
    bind_tp: int | None = None
    # The first of n > 1 choices of the same prompt: share its prefill (engine/forks.py).
    fork_of: str | None = None


_SAMPLING_CHECKS = {
    "max_tokens": (_is_int, "an integer"),
    "temperature": (_is_num, "a number"),
    "top_p": (_is_num, "a number"),
    "top_k": (_is_int, "an integer"),
    "seed": (lambda x: x is None or _is_int(x), "an integer or null"),
    "stop_token_ids": (_int_list, "a list of integers"),
    "ignore_eos": (lambda x: isinstance(x, bool), "a boolean"),
    "presence_penalty": (_is_num, "a number"),
    "frequency_penalty": (_is_num, "a number"),
    "repetition_penalty": (_is_num, "a number"),
    "logit_bias": (_bias_pairs, "a list of [token id, bias] pairs"),
    "min_tokens": (_is_int, "an integer"),
    "min_p": (_is_num, "a number"),
    "logprobs": (lambda x: x is None or _is_int(x), "an integer or null"),
}
_FLOAT_KEYS = ("temperature", "top_p", "presence_penalty", "frequency_penalty")
_FLOAT_KEYS += ("repetition_penalty", "min_p")


def parse_generate(msg: dict[str, Any]) -> GenerateRequest:
    """Type-check a `generate`. Raises ProtocolError without a request id, else
    InvalidRequestError naming the field (value checks such as max_tokens >= 1 stay in the
    engine, so the worker and the engine give the same message)."""
    rid = request_id_of(msg)
    ids = msg.get("input_ids")
    if not _int_list(ids):
        raise InvalidRequestError("input_ids", "must be a list of integer token ids")
    raw = msg.get("sampling")
    if not isinstance(raw, dict):
        raise InvalidRequestError("sampling", "must be a map")
    # Missing sampling keys take the engine defaults; present ones must have the right type.
    kwargs: dict[str, Any] = {}
    for name, (ok, what) in _SAMPLING_CHECKS.items():
        if name in raw:
            if not ok(raw[name]):
                raise InvalidRequestError(name, f"must be {what}, got {raw[name]!r}")
            kwargs[name] = raw[name]
    if "stop_token_ids" in kwargs:
        kwargs["stop_token_ids"] = tuple(kwargs["stop_token_ids"])
    for name in _FLOAT_KEYS:
        if name in kwargs:
            kwargs[name] = float(kwargs[name])
    if "logit_bias" in kwargs:
        kwargs["logit_bias"] = tuple((int(t), float(b)) for t, b in kwargs["logit_bias"])
    klass = msg.get("class", "feasible")
    if klass not in CLASSES:
        raise InvalidRequestError("class", f"must be one of {CLASSES}, got {klass!r}")
    tier = msg.get("tier", "")
    if not isinstance(tier, str):
        raise InvalidRequestError("tier", f"must be a string, got {tier!r}")
    target = msg.get("decode_target")
    if target is not None and not _is_int(target):
        raise InvalidRequestError("decode_target", f"must be an integer or null, got {target!r}")
    ttft = msg.get("ttft_ms")
    if ttft is not None and not (_is_num(ttft) and ttft > 0):
        raise InvalidRequestError("ttft_ms", f"must be a positive number or null, got {ttft!r}")
    priority = msg.get("priority", 0)
    if not _is_int(priority):
        raise InvalidRequestError("priority", f"must be an integer, got {priority!r}")
    preempt = msg.get("preempt", True)
    if not isinstance(preempt, bool):
        raise InvalidRequestError("preempt", f"must be a boolean, got {preempt!r}")
    bind_tp = msg.get("bind_tp")
    if bind_tp is not None and not (_is_int(bind_tp) and bind_tp >= 1):
        raise InvalidRequestError("bind_tp", f"must be a positive integer, got {bind_tp!r}")
    fork_of = msg.get("fork_of")
    if fork_of is not None and not (isinstance(fork_of, str) and fork_of):
        raise InvalidRequestError("fork_of", f"must be a request id or null, got {fork_of!r}")
    # Structured output rides in SamplingParams inside the worker (it goes wherever they go).
    kwargs["grammar"] = GrammarSpec.from_wire(msg.get("grammar"))
    sampling = SamplingParams(**kwargs)
    ttft_ms = None if ttft is None else float(ttft)
    return GenerateRequest(
        rid, ids, sampling, tier, klass, target, ttft_ms, priority, preempt, bind_tp, fork_of
    )


@dataclass(frozen=True)
class Group:
    """One group of a `reconfigure` plan."""

    members: list[int]
    tp: int
    role: str
    tiers: list[str]
    accepts_background: bool
    max_batch: int | None = None  # optional extension: the local scheduler's batch cap
    pp: int = 1  # pipeline stages of `tp` devices, members stage-major (1: a TP group)


def parse_reconfigure(msg: dict[str, Any]) -> tuple[int, list[Group]]:
    """(epoch, groups) of a `reconfigure`; ProtocolError naming the bad field."""
    epoch = msg.get("epoch")
    if not _is_int(epoch):
        raise ProtocolError(f"reconfigure: 'epoch' must be an integer, got {epoch!r}")
    raw = msg.get("groups")
    if not isinstance(raw, list):
        raise ProtocolError("reconfigure: 'groups' must be a list")
    groups = []
    for i, g in enumerate(raw):
        where = f"reconfigure: groups[{i}]"
        if not isinstance(g, dict):
            raise ProtocolError(f"{where} must be a map")
        if not _int_list(g.get("members")) or not g["members"]:
            raise ProtocolError(f"{where}.members must be a non-empty list of worker ids")
        if not _is_int(g.get("tp")) or g["tp"] < 1:
            raise ProtocolError(f"{where}.tp must be an integer >= 1, got {g.get('tp')!r}")
        if g.get("role") not in ROLES:
            raise ProtocolError(f"{where}.role must be one of {ROLES}, got {g.get('role')!r}")
        tiers = g.get("tiers", [])
        if not isinstance(tiers, list) or not all(isinstance(t, str) for t in tiers):
            raise ProtocolError(f"{where}.tiers must be a list of strings")
        cap = g.get("max_batch")
        if cap is not None and (not _is_int(cap) or cap < 1):
            raise ProtocolError(f"{where}.max_batch must be an integer >= 1, got {cap!r}")
        pp = g.get("pp", 1)
        if not _is_int(pp) or pp < 1:
            raise ProtocolError(f"{where}.pp must be an integer >= 1, got {pp!r}")
        background = bool(g.get("accepts_background", True))
        groups.append(Group(g["members"], g["tp"], g["role"], tiers, background, cap, pp))
    return epoch, groups
