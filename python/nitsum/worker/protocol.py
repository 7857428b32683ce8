"""Router ↔ worker messages (docs/protocol.md, v1): msgpack maps with `v` and `type`.

Builders return plain dicts (encode them with `encode`); `decode` turns a received frame into
a dict. Router → worker messages become typed requests in `inbound.py`.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

import msgpack

from nitsum.sampling import SamplingParams
from nitsum.sampling_logprobs import TokenLogprob

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
    error_param: str | None = None,
    prompt_logprobs: list[TokenLogprob] | None = None,
) -> dict[str, Any]:
    """New token ids of one request; the last message of a request has a `finish_reason`.
    `queue_ms` (with a request's first tokens): how long it waited before its first step.
    With `logprobs` (one per token id, when the request asked): key `logprobs`, a list of
    `{"logprob": float, "top": [[id, logprob], ...]}`. `error_param` (with `error`): the
    request field the worker refused, so the client gets a 400 naming it rather than a 500.
    `prompt_logprobs` (with the first token, when asked): the prompt tokens' after the first,
    in the same shape as `logprobs`."""
    assert finish_reason is None or finish_reason in FINISH_REASONS, finish_reason
    extra: dict[str, Any] = {} if queue_ms is None else {"queue_ms": queue_ms}
    if error_param is not None:
        extra["error_param"] = error_param
    if logprobs is not None:
        extra["logprobs"] = _wire_logprobs(logprobs)
    if prompt_logprobs is not None:
        extra["prompt_logprobs"] = _wire_logprobs(prompt_logprobs)
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


def _wire_logprobs(lps: list[TokenLogprob]) -> list[dict[str, Any]]:
    return [{"logprob": lp.logprob, "top": [[t, v] for t, v in lp.top]} for lp in lps]


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
