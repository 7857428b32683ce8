"""`generate` (router → worker) parsed into a typed, validated request (docs/protocol.md, v1).

The parser raises ProtocolError without a request id, else InvalidRequestError naming the bad
field; the frame itself is decoded by `protocol.decode`, the other messages by their
dataclasses (protocol.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from nitsum.engine.request_spec import RequestSpec, is_int, is_num
from nitsum.errors import InvalidRequestError
from nitsum.sampling import SamplingParams
from nitsum.structured.spec import GrammarSpec
from nitsum.worker.protocol import ProtocolError


def _int_list(x: object) -> bool:
    return isinstance(x, list) and all(is_int(t) for t in x)


def _bias_pairs(x: object) -> bool:
    return isinstance(x, list) and all(
        isinstance(p, list) and len(p) == 2 and is_int(p[0]) and is_num(p[1]) for p in x
    )


def request_id_of(msg: dict[str, Any]) -> str:
    """The `request_id` of a `generate`/`abort`; without one nobody can be answered."""
    rid = msg.get("request_id")
    if not isinstance(rid, str) or not rid:
        raise ProtocolError(f"{msg['type']}: 'request_id' must be a non-empty string, got {rid!r}")
    return rid


@dataclass(frozen=True)
class GenerateRequest:
    """A validated `generate` message: the request's id, its prompt and what it asks for."""

    request_id: str
    input_ids: list[int]
    spec: RequestSpec


_SAMPLING_CHECKS = {
    "max_tokens": (is_int, "an integer"),
    "temperature": (is_num, "a number"),
    "top_p": (is_num, "a number"),
    "top_k": (is_int, "an integer"),
    "seed": (lambda x: x is None or is_int(x), "an integer or null"),
    "stop_token_ids": (_int_list, "a list of integers"),
    "ignore_eos": (lambda x: isinstance(x, bool), "a boolean"),
    "presence_penalty": (is_num, "a number"),
    "frequency_penalty": (is_num, "a number"),
    "repetition_penalty": (is_num, "a number"),
    "logit_bias": (_bias_pairs, "a list of [token id, bias] pairs"),
    "min_tokens": (is_int, "an integer"),
    "resumed_tokens": (is_int, "an integer"),
    "min_p": (is_num, "a number"),
    "logprobs": (lambda x: x is None or is_int(x), "an integer or null"),
    "prompt_logprobs": (lambda x: x is None or is_int(x), "an integer or null"),
    "allowed_token_ids": (_int_list, "a list of integers"),
    "bad_words": (lambda x: isinstance(x, list) and all(map(_int_list, x)), "a list of id lists"),
}
_FLOAT_KEYS: tuple[str, ...] = ("temperature", "top_p", "presence_penalty", "frequency_penalty")
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
    for name in ("stop_token_ids", "allowed_token_ids"):
        if name in kwargs:
            kwargs[name] = tuple(kwargs[name])
    if "bad_words" in kwargs:
        kwargs["bad_words"] = tuple(tuple(word) for word in kwargs["bad_words"])
    for name in _FLOAT_KEYS:
        if name in kwargs:
            kwargs[name] = float(kwargs[name])
    if "logit_bias" in kwargs:
        kwargs["logit_bias"] = tuple((int(t), float(b)) for t, b in kwargs["logit_bias"])
    # Structured output rides in SamplingParams inside the worker (it goes wherever they go).
    kwargs["grammar"] = GrammarSpec.from_wire(msg.get("grammar"))
    # NOTE: every other field is checked by its declaration on RequestSpec (from_wire).
    spec = RequestSpec.from_wire(msg, SamplingParams(**kwargs))
    return GenerateRequest(rid, cast(list[int], ids), spec)
