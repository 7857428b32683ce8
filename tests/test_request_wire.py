"""One decoder of a RequestSpec on the wire (engine/request_wire.py) for both of its paths:
the router's `generate` (worker/inbound.py) and a KV handoff across hosts
(pool/remote_handoff.py). A spec with every field set survives both equal, the encoder
writes exactly the router's form, and a bad field is named alike on both paths."""

from __future__ import annotations

from dataclasses import MISSING, fields, replace
from typing import Any

import msgpack
import pytest
from tokenizers import Tokenizer

from nitsum.engine.request_spec import RequestSpec
from nitsum.engine.request_wire import sampling_to_wire, spec_from_wire, spec_to_wire
from nitsum.engine.sequence import Sequence
from nitsum.errors import InvalidRequestError
from nitsum.pool.handoff_meta import handoff_meta, handoff_sequence
from nitsum.sampling import SamplingParams
from nitsum.structured import compiler
from nitsum.structured.compiler import GrammarCompiler
from nitsum.structured.spec import GrammarSpec
from nitsum.worker import inbound
from nitsum.worker import protocol as proto
from structured_helpers import EOS, tokenizer_json
from wire_golden import generate as golden_generate

# Every field away from its default (checked below, so a new field must be added here).
SAMPLING = SamplingParams(
    max_tokens=32, temperature=0.5, top_p=0.75, top_k=40, seed=1234, stop_token_ids=(2, 13),
    ignore_eos=True, presence_penalty=0.25, frequency_penalty=-0.5, repetition_penalty=1.25,
    logit_bias=((7, 2.5), (9, -1.0)), min_tokens=3, min_p=0.125, logprobs=2,
    prompt_logprobs=1, grammar=GrammarSpec("json_object"), resumed_tokens=1,
    allowed_token_ids=(5, 9, 27), bad_words=((13,), (15, 27)),
)  # fmt: skip
SPEC = RequestSpec(
    SAMPLING, tier="gold", klass="background", ttft_ms=250.0, tpot_ms=30.0, weight=3.0,
    priority=-2, may_preempt=False, bind_tp=2, fork_of="r0", decode_target=3,
    truncate_prompt_tokens=4, cache_salt="tenant-a",
)  # fmt: skip


def roundtrip(msg: dict[str, Any]) -> dict[str, Any]:
    """`msg` as the other side reads it (msgpack: tuples become lists)."""
    return msgpack.unpackb(msgpack.packb(msg, use_bin_type=True), raw=False)


@pytest.fixture(scope="module")
def tok(smollm2_dir) -> Tokenizer:
    compiler.use(GrammarCompiler(tokenizer_json(smollm2_dir), [EOS]))
    yield Tokenizer.from_file(str(smollm2_dir / "tokenizer.json"))
    compiler.use(None)


def test_the_spec_under_test_sets_every_field():
    for obj in (SAMPLING, SPEC):
        for f in fields(obj):
            default = f.default_factory() if f.default is MISSING else f.default  # type: ignore[misc]
            if f.name != "bind_hard":  # NOTE: not on the wire (the worker's own choice)
                assert getattr(obj, f.name) != default, f"{type(obj).__name__}.{f.name}"


def test_a_generate_with_every_field_parses_into_the_same_spec():
    msg = roundtrip({"v": 1, "type": "generate", "request_id": "r1", "input_ids": [1, 2, 3, 4, 5]}
                    | spec_to_wire(SPEC))  # fmt: skip
    req = inbound.parse_generate(msg)
    assert (req.request_id, req.input_ids) == ("r1", [1, 2, 3, 4, 5])
    assert req.spec == SPEC
    assert proto.generate("r1", [1], SAMPLING)["sampling"] == sampling_to_wire(SAMPLING)


def test_a_handoff_with_every_field_rebuilds_the_same_spec(tok):
    prompt = tok.encode("Give me JSON:").ids
    seq = Sequence("r1", prompt, SPEC)
    seq.output_ids = tok.encode('{"a": ', add_special_tokens=False).ids
    seq.klass = "feasible"  # NOTE: the class as the scheduler left it travels
    seq.num_computed = len(seq.prompt_ids) + len(seq.output_ids) - 1
    got = handoff_sequence(roundtrip(handoff_meta(seq, target=3)))
    assert got.spec == replace(SPEC, klass="feasible")
    assert (got.request_id, got.prompt_ids, got.output_ids) == (
        "r1",
        seq.prompt_ids,
        seq.output_ids,
    )


def test_the_encoder_writes_the_routers_generate_exactly():
    """The golden `generate` (as the router sends it) decodes and encodes back key for key."""
    wire = golden_generate()
    spec = spec_from_wire(roundtrip(wire))
    rest = {k: v for k, v in wire.items() if k not in ("v", "type", "request_id", "input_ids")}
    assert spec_to_wire(spec) == rest
    assert "grammar" not in spec_to_wire(replace(spec, sampling=SamplingParams()))


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"sampling": {"logit_bias": [[7, "x"]]}}, "logit_bias"),
        ({"sampling": {"bad_words": [13]}}, "bad_words"),
        ({"sampling": {"ignore_eos": 1}}, "ignore_eos"),
        ({"sampling": {"max_tokens": True}}, "max_tokens"),
        ({"sampling": [1]}, "sampling"),
        ({"preempt": "no"}, "preempt"),
        ({"grammar": {"kind": "regex-ish"}}, "response_format"),
    ],
)
def test_a_bad_field_is_named_alike_on_both_paths(change, field):
    good = spec_to_wire(SPEC)
    msg = {"v": 1, "type": "generate", "request_id": "r1", "input_ids": [1]} | good | change
    with pytest.raises(InvalidRequestError) as by_router:
        inbound.parse_generate(msg)
    with pytest.raises(InvalidRequestError) as by_handoff:
        spec_from_wire(good | change)
    assert by_router.value.field == by_handoff.value.field == field
