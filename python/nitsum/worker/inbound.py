"""`generate` (router → worker) decoded into the engines' request (docs/protocol.md, v1).

The one codec type-checks it (engine/generate_message.py `Generate`): a malformed message is a
ProtocolError naming the field; the router checked every value range before it sent it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nitsum.engine.generate_message import Generate
from nitsum.engine.request_spec import RequestSpec
from nitsum.worker.protocol import ProtocolError


def request_id_of(msg: dict[str, Any]) -> str:
    """The `request_id` of a `generate`/`abort`; without one nobody can be answered."""
    rid = msg.get("request_id")
    if not isinstance(rid, str) or not rid:
        raise ProtocolError(f"{msg['type']}: 'request_id' must be a non-empty string, got {rid!r}")
    return rid


@dataclass(frozen=True)
class GenerateRequest:
    """A decoded `generate`: the request's id, its prompt and what it asks for."""

    request_id: str
    input_ids: list[int]
    spec: RequestSpec


def parse_generate(msg: dict[str, Any]) -> GenerateRequest:
    """Decode a `generate`; ProtocolError naming the field of a malformed one."""
    rid = request_id_of(msg)
    gen = Generate.from_wire(msg)
    return GenerateRequest(rid, gen.input_ids, gen.spec())
