"""The `generate` message (router → worker, docs/protocol.md): one request's prompt and what it
asks for, nested as the router's Rust `Generate` is (scheduler-rs protocols/worker/generate.rs).

`sampling` (how a token is drawn), `stop` (when the output ends), `output` (what comes back
besides the tokens), `contract` (the tier's terms) and `routing` (where the KV comes from or
goes) are frozen dataclasses that the one codec (nitsum/codec.py) encodes and type-checks like
every other message; a malformed one is a ProtocolError naming the field.

NOTE: value ranges are the router's to check, once (protocols/sampling_fields.rs,
api/prepare.rs); the in-process `LLM` API checks its own with `SamplingParams.validate`. The
`sampling`, `stop` and `output` parts are declared once, in nitsum/sampling.py, where
`SamplingParams` inherits their fields: a new sampling field is one line there.

The message lives on the engine floor (re-exported by worker/protocol.py beside the other
messages) because a KV handoff across hosts (pool/handoff_meta.py) carries a request in it too.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal, cast

from nitsum.codec import Message, closed, wire_field
from nitsum.engine.request_spec import RequestSpec
from nitsum.sampling import Output, Sampling, SamplingParams, Stop
from nitsum.structured.spec import GrammarSpec

# The worker's local-scheduler classes (engine/request_spec.py `CLASSES`).
Class = Literal["feasible", "best_effort", "background"]


@closed
@dataclass(frozen=True)
class Contract:
    """The tier's terms: whom the local scheduler serves first and against which targets."""

    tier: str = ""
    slo_class: Class = wire_field(key="class", default="feasible")
    ttft_ms: float | None = wire_field(omit=None, default=None)
    tpot_ms: float | None = wire_field(omit=None, default=None)
    weight: float = 1.0
    priority: int = 0
    preempt: bool = True
    bind_tp: int | None = wire_field(omit=None, default=None)


@closed
@dataclass(frozen=True)
class Routing:
    """Where the request's KV comes from (a fork's first choice) or goes (P/D)."""

    fork_of: str | None = wire_field(omit=None, default=None)
    decode_target: int | None = None
    cache_salt: str | None = wire_field(omit=None, default=None)


_PARTS = (Sampling, Stop, Output)
# NOTE: every SamplingParams field rides in one part (or beside them): none is dropped (a
# field added to SamplingParams itself, not to a part, fails here).
assert {f.name for p in _PARTS for f in fields(p)} | {"resumed_tokens", "grammar"} == {
    f.name for f in fields(SamplingParams)
}


def _values(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


def _part(cls: type[Any], params: SamplingParams) -> Any:
    return cls(**{f.name: getattr(params, f.name) for f in fields(cls)})


@closed
@dataclass(frozen=True)
class Generate(Message):
    """`generate`: serve `input_ids` as the parts say."""

    TYPE = "generate"
    request_id: str
    input_ids: list[int]
    # The last this-many `input_ids` are output streamed before a resume (penalties count them).
    resumed_tokens: int = 0
    sampling: Sampling = field(default_factory=Sampling)
    stop: Stop = field(default_factory=Stop)
    output: Output = field(default_factory=Output)
    contract: Contract = field(default_factory=Contract)
    routing: Routing = field(default_factory=Routing)
    # vLLM's `truncate_prompt_tokens`: serve only the last this-many prompt ids.
    truncate_prompt_tokens: int | None = wire_field(omit=None, default=None)
    grammar: GrammarSpec | None = wire_field(omit=None, default=None)

    @classmethod
    def of(cls, request_id: str, input_ids: list[int], spec: RequestSpec) -> Generate:
        """The message that asks for `spec` (tests, tools and the KV handoff)."""
        p = spec.sampling
        contract = Contract(
            spec.tier, cast(Class, spec.slo_class), spec.ttft_ms, spec.tpot_ms, spec.weight,
            spec.priority, spec.may_preempt, spec.bind_tp,
        )  # fmt: skip
        routing = Routing(spec.fork_of, spec.decode_target, spec.cache_salt)
        return cls(
            request_id, list(input_ids), p.resumed_tokens,
            _part(Sampling, p), _part(Stop, p), _part(Output, p), contract, routing,
            spec.truncate_prompt_tokens, p.grammar,
        )  # fmt: skip

    def spec(self) -> RequestSpec:
        """The engines' view of the request (`of`'s inverse)."""
        parts = _values(self.sampling) | _values(self.stop) | _values(self.output)
        # NOTE: a grammar's kind and source are checked as the structured path names them
        # (InvalidRequestError on `response_format`), as the in-process API's are.
        grammar = None if self.grammar is None else self.grammar.checked()
        sampling = SamplingParams(**parts, resumed_tokens=self.resumed_tokens, grammar=grammar)
        c, r = self.contract, self.routing
        return RequestSpec(
            sampling, tier=c.tier, slo_class=c.slo_class, ttft_ms=c.ttft_ms, tpot_ms=c.tpot_ms,
            weight=c.weight, priority=c.priority, may_preempt=c.preempt, bind_tp=c.bind_tp,
            fork_of=r.fork_of, decode_target=r.decode_target, cache_salt=r.cache_salt,
            truncate_prompt_tokens=self.truncate_prompt_tokens,
        )  # fmt: skip
