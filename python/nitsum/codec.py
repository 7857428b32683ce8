"""One codec for every router ↔ worker message (docs/protocol.md, v1), driven by dataclass fields.

A message is a frozen dataclass with a `TYPE`; its fields are the wire keys (`wire_field(key=)`
renames one, e.g. a Python keyword such as `class`), their type hints the schema. `to_wire`
builds the msgpack map (`v`, `type`, then the fields), `from_wire` type-checks a received map
into the dataclass and raises ProtocolError naming the bad field.
Adding a field to a message is one line. The golden fixtures in tests/golden/wire/ pin the
result against the router's Rust types (tests/test_wire_golden.py, scheduler-rs
`protocols/wire_golden/`).

A class marked `closed` (the request contract: `generate` and its parts) refuses a key it does
not declare, naming it: a router newer than the worker asking for a field the worker lacks
gets an error, not a request served without it. Other messages ignore unknown keys.

Supported hints: int, float, str, bool, `Literal[...]`, `X | None`, unions tried in order,
`list[X]`, `tuple[X, ...]`, `tuple[X, Y]` (a list on the wire), `dict[str, X]` and nested
dataclasses (a map without `v` / `type`).
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, ClassVar, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

import msgpack

PROTOCOL_VERSION = 1

M = TypeVar("M", bound="Message")
T = TypeVar("T")


def is_int(x: object) -> bool:
    """A wire integer (msgpack's bool is not one)."""
    return isinstance(x, int) and not isinstance(x, bool)


class ProtocolError(ValueError):
    """A message that cannot be acted on (not a v1 map, or a field of the wrong shape);
    `field`: the bad field's path in the message (`sampling.top_k`), when one is."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class _Always:
    """`omit` sentinel: the key is always on the wire."""


ALWAYS = _Always()


def wire_field(
    *,
    omit: Any = ALWAYS,
    check: tuple[typing.Callable[[Any], bool], str] | None = None,
    key: str | None = None,
    default: Any = dataclasses.MISSING,
    default_factory: Any = dataclasses.MISSING,
) -> Any:
    """A dataclass field with wire options: `omit`: leave the key out when the value equals
    this (None for an optional key; absent keys decode to the field's default); `check`:
    (predicate on the decoded value, what it must be) for value constraints; `key`: the wire
    key when it is not the field's name."""
    meta = {"omit": omit, "check": check, "key": key}
    return dataclasses.field(default=default, default_factory=default_factory, metadata=meta)


_CLOSED_ATTR = "__wire_closed__"


def closed(cls: type[T]) -> type[T]:
    """Mark dataclass `cls` closed: decoding refuses a key it does not declare (and a
    subclass, e.g. `SamplingParams` of the `sampling` part, inherits the mark)."""
    setattr(cls, _CLOSED_ATTR, True)
    return cls


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


# -- messages -------------------------------------------------------------------------------------
class Message:
    """Base of the message dataclasses: `TYPE` is the wire `type`."""

    TYPE: ClassVar[str]

    def to_wire(self) -> dict[str, Any]:
        """The msgpack map of this message (encode it with `encode`)."""
        return {"v": PROTOCOL_VERSION, "type": self.TYPE, **_fields_to_wire(self)}

    @classmethod
    def from_wire(cls: type[M], msg: dict[str, Any]) -> M:
        """Type-check a decoded map (`decode`) of this type; unknown keys are ignored unless
        the class is `closed`."""
        if msg.get("type") != cls.TYPE:
            raise ProtocolError(f"expected a {cls.TYPE!r} message, got {msg.get('type')!r}")
        try:
            return _from_map(cls, msg, "")
        except _Bad as e:
            raise ProtocolError(f"{cls.TYPE}: {e}", e.path) from None


def to_map(obj: Any) -> dict[str, Any]:
    """A nested dataclass (a field of a message) as its wire map."""
    return _fields_to_wire(obj)


def from_map(cls: type[T], raw: dict[str, Any], where: str) -> T:
    """Type-check map `raw` into dataclass `cls` outside a message (a nested value decoded
    on its own); ProtocolError naming the bad field under `where`."""
    try:
        return _from_map(cls, raw, where)
    except _Bad as e:
        raise ProtocolError(str(e), e.path) from None


class _Bad(Exception):
    """A field of the wrong shape; the message names its `path`."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(message)
        self.path = path


def _key(f: dataclasses.Field[Any]) -> str:
    return f.metadata.get("key") or f.name


@functools.cache
def _wire_keys(cls: type) -> tuple[tuple[str, str, Any], ...]:
    """(field name, wire key, its `omit` value) of a dataclass, in field order.
    NOTE: cached per class: a worker encodes a `tokens` message per request per step."""
    fields = dataclasses.fields(cls)
    return tuple((f.name, _key(f), f.metadata.get("omit", ALWAYS)) for f in fields)


def _fields_to_wire(obj: Any) -> dict[str, Any]:
    out = {}
    for name, key, omit in _wire_keys(obj.__class__):
        value = getattr(obj, name)
        if omit is not ALWAYS and value == omit:
            continue
        out[key] = _to_wire_value(value)
    return out


_SCALARS = (int, float, str, bool, type(None))


def _to_wire_value(value: Any) -> Any:
    if isinstance(value, _SCALARS):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _fields_to_wire(value)
    if isinstance(value, (list, tuple)):
        return [_to_wire_value(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_wire_value(v) for k, v in value.items()}
    return value


@functools.cache
def _declared_keys(cls: type, top: bool) -> frozenset[str]:
    """The wire keys a closed dataclass takes (`v` and `type` too at a message's top).
    NOTE: cached per class: every `generate` decodes seven closed maps."""
    keys = frozenset(key for _, key, _ in _wire_keys(cls))
    return keys | {"v", "type"} if top else keys


@functools.cache
def _schema(cls: type) -> list[tuple[dataclasses.Field[Any], Any]]:
    """(field, resolved type hint) of a dataclass, in field order."""
    hints = get_type_hints(cls)
    return [(f, hints[f.name]) for f in dataclasses.fields(cls)]


def _from_map(cls: Any, raw: Any, where: str) -> Any:
    """An instance of dataclass `cls` from map `raw` (at `where` in the message)."""
    if not isinstance(raw, dict):
        raise _Bad(where, f"{where or 'message'} must be a map, got {raw!r}")
    if getattr(cls, _CLOSED_ATTR, False):
        declared = _declared_keys(cls, top=not where)
        unknown = sorted(k for k in raw if k not in declared)
        if unknown:
            path = f"{where}.{unknown[0]}" if where else str(unknown[0])
            raise _Bad(path, f"{path} is not a field this worker knows (unknown: {unknown})")
    kwargs = {}
    for f, hint in _schema(cls):
        key = _key(f)
        path = f"{where}.{key}" if where else key
        if key not in raw:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise _Bad(path, f"{path} is missing")
            continue
        value = _from_wire_value(hint, raw[key], path)
        check = f.metadata.get("check")
        if check is not None and not check[0](value):
            raise _Bad(path, f"{path} must be {check[1]}, got {raw[key]!r}")
        kwargs[f.name] = value
    return cls(**kwargs)


def _from_wire_value(hint: Any, value: Any, path: str) -> Any:
    """`value` as `hint` says, or _Bad naming `path` and what it must be."""
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for alt in args:
            try:
                return _from_wire_value(alt, value, path)
            except _Bad as e:
                if e.path != path:  # the shape matched, something inside did not: say what
                    raise
    elif hint is type(None):
        if value is None:
            return None
    elif hint is int:
        if is_int(value):
            return value
    elif hint is float:
        if is_int(value) or isinstance(value, float):
            return float(value)
    elif hint is str or hint is bool:
        if isinstance(value, hint):
            return value
    elif origin is Literal:
        if value in args and isinstance(value, str):
            return value
    elif origin is list and isinstance(value, list):
        return [_from_wire_value(args[0], v, f"{path}[{i}]") for i, v in enumerate(value)]
    elif origin is tuple and isinstance(value, list):
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_from_wire_value(args[0], v, f"{path}[{i}]") for i, v in enumerate(value))
        if len(value) == len(args):
            pairs = enumerate(zip(args, value, strict=True))
            return tuple(_from_wire_value(a, v, f"{path}[{i}]") for i, (a, v) in pairs)
    elif origin is dict and isinstance(value, dict):
        if all(isinstance(k, str) for k in value):
            return {k: _from_wire_value(args[1], v, f"{path}.{k}") for k, v in value.items()}
    elif dataclasses.is_dataclass(hint):
        return _from_map(hint, value, path)
    raise _Bad(path, f"{path} must be {describe(hint)}, got {value!r}")


def describe(hint: Any) -> str:
    """What a value of `hint` is, for error messages ("an integer or null")."""
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, types.UnionType):
        return " or ".join(describe(a) for a in args)
    if origin is Literal:
        return f"one of {args}"
    if origin is tuple and args[-1] is not Ellipsis:
        return f"a [{', '.join(describe(a).split(' ', 1)[-1] for a in args)}] list"
    if origin in (list, tuple):
        return f"a list of {describe(args[0]).split(' ', 1)[-1]}s"
    if origin is dict:
        return "a map"
    names = {int: "an integer", float: "a number", str: "a string", bool: "a boolean"}
    return names.get(hint, "null" if hint is type(None) else "a map")
