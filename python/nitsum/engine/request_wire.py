"""A whole `RequestSpec` on the wire: the one decoder and encoder of its `generate` form.

A `generate` message (docs/protocol.md) carries the spec's own fields at its top level
(checked by their declarations, `RequestSpec.from_wire`), the SamplingParams under `sampling`
and the grammar under `grammar`. The worker parses the router's messages with `spec_from_wire`
(worker/inbound.py), and a KV handoff across hosts (pool/remote_handoff.py) carries the spec
in the same form, so both paths decode one way and a new sampling field is added here once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any

from nitsum.engine.request_spec import RequestSpec, is_int, is_num
from nitsum.errors import InvalidRequestError
from nitsum.sampling import SamplingParams
from nitsum.structured.spec import GrammarSpec


def _int_list(x: object) -> bool:
    return isinstance(x, list | tuple) and all(is_int(t) for t in x)


def _bias_pairs(x: object) -> bool:
    return isinstance(x, list | tuple) and all(
        isinstance(p, list | tuple) and len(p) == 2 and is_int(p[0]) and is_num(p[1]) for p in x
    )


def _optional_int(x: object) -> bool:
    return x is None or is_int(x)


def _id_tuple(x: Any) -> tuple[int, ...]:
    return tuple(int(t) for t in x)


# Every SamplingParams field but `grammar` (it rides beside them), by wire key: (valid when,
# what it must be, how it is stored). NOTE: msgpack has no tuples and a loose encoder sends
# an integral float as an int, so lists become tuples and numbers floats here.
_SAMPLING: dict[str, tuple[Callable[[object], bool], str, Callable[[Any], Any]]] = {
    "max_tokens": (is_int, "an integer", int),
    "temperature": (is_num, "a number", float),
    "top_p": (is_num, "a number", float),
    "top_k": (is_int, "an integer", int),
    "seed": (_optional_int, "an integer or null", lambda x: x),
    "stop_token_ids": (_int_list, "a list of integers", _id_tuple),
    "ignore_eos": (lambda x: isinstance(x, bool), "a boolean", bool),
    "presence_penalty": (is_num, "a number", float),
    "frequency_penalty": (is_num, "a number", float),
    "repetition_penalty": (is_num, "a number", float),
    "logit_bias": (
        _bias_pairs,
        "a list of [token id, bias] pairs",
        lambda x: tuple((int(t), float(b)) for t, b in x),
    ),
    "min_tokens": (is_int, "an integer", int),
    "min_p": (is_num, "a number", float),
    "logprobs": (_optional_int, "an integer or null", lambda x: x),
    "resumed_tokens": (is_int, "an integer", int),
    "prompt_logprobs": (_optional_int, "an integer or null", lambda x: x),
    "allowed_token_ids": (_int_list, "a list of integers", _id_tuple),
    "bad_words": (
        lambda x: isinstance(x, list | tuple) and all(map(_int_list, x)),
        "a list of id lists",
        lambda x: tuple(_id_tuple(word) for word in x),
    ),
}
# NOTE: a SamplingParams field missing here would be silently dropped on the wire.
assert set(_SAMPLING) | {"grammar"} == {f.name for f in fields(SamplingParams)}


def sampling_from_wire(raw: object, grammar: object = None) -> SamplingParams:
    """The SamplingParams of a `sampling` map (and a `grammar` map or None): missing keys
    take the engine defaults, present ones must have the right type, else
    InvalidRequestError naming the key. Value checks (max_tokens >= 1, ...) stay in
    `SamplingParams.validate`, so the worker and the engine give the same message."""
    if not isinstance(raw, dict):
        raise InvalidRequestError("sampling", "must be a map")
    kwargs: dict[str, Any] = {}
    for key, (ok, what, convert) in _SAMPLING.items():
        if key in raw:
            if not ok(raw[key]):
                raise InvalidRequestError(key, f"must be {what}, got {raw[key]!r}")
            kwargs[key] = convert(raw[key])
    return SamplingParams(**kwargs, grammar=GrammarSpec.from_wire(grammar))


def sampling_to_wire(sampling: SamplingParams) -> dict[str, Any]:
    """`sampling_from_wire`'s inverse: the `sampling` map (lists for tuples; no grammar)."""
    out: dict[str, Any] = {}
    for key in _SAMPLING:
        value = getattr(sampling, key)
        if key == "logit_bias":
            value = [[t, b] for t, b in value]
        elif key == "bad_words":
            value = [list(word) for word in value]
        elif isinstance(value, tuple):
            value = list(value)
        out[key] = value
    return out


def spec_from_wire(msg: dict[str, Any]) -> RequestSpec:
    """The RequestSpec a `generate`-shaped map carries (`sampling`, `grammar` and the spec's
    own keys); InvalidRequestError names the first bad field."""
    sampling = sampling_from_wire(msg.get("sampling"), msg.get("grammar"))
    return RequestSpec.from_wire(msg, sampling)


def spec_to_wire(spec: RequestSpec) -> dict[str, Any]:
    """`spec_from_wire`'s inverse, keyed as the router's `generate` (no `grammar` key
    without one, as the router omits it)."""
    grammar = spec.sampling.grammar
    out = {"sampling": sampling_to_wire(spec.sampling), **spec.to_wire()}
    return out if grammar is None else out | {"grammar": grammar.to_wire()}
