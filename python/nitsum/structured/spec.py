"""What a request asks its output to match: the `grammar` field of a `generate` message."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, cast

from nitsum.codec import closed
from nitsum.errors import InvalidRequestError

# `json_object`: any JSON object; `json_schema`: a JSON value valid under `schema`;
# `regex`: text matching the regex `schema`; `lark`: text of the llguidance Lark grammar
# `schema` (vLLM's guided_regex / guided_grammar / guided_choice); `ebnf`: text the EBNF (GBNF,
# `root ::= ...`) grammar `schema` derives (SGLang's `ebnf` sampling param).
KINDS = ("json_object", "json_schema", "regex", "lark", "ebnf")
# Kinds whose `schema` is source text (not JSON).
TEXT_KINDS = ("regex", "lark", "ebnf")
# The request field a bad grammar is blamed on (the router builds grammars from it).
FIELD = "response_format"
# NOTE: an EBNF grammar comes only from /generate's `sampling_params.ebnf` and is compiled
# (so refused) only here; a regex is checked by the router before it is queued.
FIELD_OF_KIND = {"ebnf": "sampling_params.ebnf"}


def field_of(kind: str) -> str:
    """The request field a bad grammar of `kind` is blamed on."""
    return FIELD_OF_KIND.get(kind, FIELD)


@closed
@dataclass(frozen=True)
class GrammarSpec:
    """A request's grammar.

    NOTE: `replay` counts the last tokens of the prompt that are output the grammar already
    matched (a request resumed on another worker prefills its prompt plus what it had
    generated): the matcher consumes them first, so its state follows the tokens.
    """

    kind: str
    # The JSON Schema as JSON text (`json_schema`), the regex, the Lark or the EBNF grammar.
    schema: str | None = None
    replay: int = 0

    def to_wire(self) -> dict[str, Any]:
        """The protocol's `grammar` map."""
        return {"kind": self.kind, "schema": self.schema, "replay": self.replay}

    @classmethod
    def from_wire(cls, raw: object) -> GrammarSpec | None:
        """The `grammar` of a `generate` (None when absent); InvalidRequestError naming
        `response_format` for a malformed one."""
        if raw is None:
            return None
        if not isinstance(raw, dict):
            raise InvalidRequestError(FIELD, f"grammar must be a map, got {raw!r}")
        # NOTE: the fields hold whatever was sent until `checked` has looked at them.
        kind, schema, replay = raw.get("kind"), raw.get("schema"), raw.get("replay", 0)
        return cls(cast(str, kind), schema, replay).checked()

    def checked(self) -> GrammarSpec:
        """This grammar, or InvalidRequestError naming `response_format` (or the kind's own
        field) when its kind, source text or replay count is malformed."""
        kind, schema, replay = self.kind, self.schema, self.replay
        if kind not in KINDS:
            raise InvalidRequestError(FIELD, f"grammar kind must be one of {KINDS}, got {kind!r}")
        if kind == "json_schema":
            if not isinstance(schema, str):
                raise InvalidRequestError(FIELD, "a json_schema grammar needs its schema text")
            try:
                parsed = json.loads(schema)
            except ValueError as e:
                raise InvalidRequestError(FIELD, f"the schema is not JSON: {e}") from e
            if not isinstance(parsed, (dict, bool)):
                raise InvalidRequestError(FIELD, "the schema must be a JSON object")
        elif kind in TEXT_KINDS:
            if not isinstance(schema, str) or not schema:
                raise InvalidRequestError(field_of(kind), f"a {kind} grammar needs its source text")
        elif schema is not None:
            raise InvalidRequestError(FIELD, "a json_object grammar takes no schema")
        if not isinstance(replay, int) or isinstance(replay, bool) or replay < 0:
            raise InvalidRequestError(FIELD, f"grammar replay must be an integer >= 0: {replay!r}")
        return self
