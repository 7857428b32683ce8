"""`generate` (router → worker) parsed into a typed, validated request (docs/protocol.md, v1).

The parser raises ProtocolError without a request id, else InvalidRequestError naming the bad
field; the frame itself is decoded by `protocol.decode`, the other messages by their
dataclasses (protocol.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from nitsum.engine.request_spec import RequestSpec, is_int
from nitsum.engine.request_wire import spec_from_wire
from nitsum.errors import InvalidRequestError
from nitsum.worker.protocol import ProtocolError


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


def parse_generate(msg: dict[str, Any]) -> GenerateRequest:
    """Type-check a `generate`. Raises ProtocolError without a request id, else
    InvalidRequestError naming the field (value checks such as max_tokens >= 1 stay in the
    engine, so the worker and the engine give the same message)."""
    rid = request_id_of(msg)
    ids = msg.get("input_ids")
    if not isinstance(ids, list) or not all(is_int(t) for t in ids):
        raise InvalidRequestError("input_ids", "must be a list of integer token ids")
    # NOTE: one decoder for the router's messages and the KV handoffs (engine/request_wire.py).
    spec = spec_from_wire(msg)
    return GenerateRequest(rid, cast(list[int], ids), spec)
