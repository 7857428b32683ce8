"""One `generate` message (engine/generate_message.py), decoded by the one codec, for both of
its paths: the router's (worker/inbound.py) and a KV handoff across hosts
(pool/remote_handoff.py). A spec with every field set survives both equal, the golden message
decodes and encodes back key for key, and a bad field is named alike on both paths."""

from __future__ import annotations

from dataclasses import MISSING, fields, replace
from typing import Any

import msgpack
import pytest
from tokenizers import Tokenizer

from nitsum.codec import ProtocolError
from nitsum.engine.generate_message import Generate
from nitsum.engine.request_spec import RequestSpec
from nitsum.engine.sequence import Sequence
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
    allowed_token_ids=(5, 9, 27), bad_words=((13,), (15, 27)), no_repeat_ngram_size=3,
)  # fmt: skip
SPEC = RequestSpec(
    SAMPLING, tier="gold", slo_class="background", ttft_ms=250.0, tpot_ms=30.0, weight=3.0,
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
            factory: Any = f.default_factory
            default = factory() if f.default is MISSING else f.default
            if f.name != "bind_hard":  # NOTE: not on the wire (the worker's own choice)
                assert getattr(obj, f.name) != default, f"{type(obj).__name__}.{f.name}"


def test_a_generate_with_every_field_parses_into_the_same_spec():
    msg = roundtrip(Generate.of("r1", [1, 2, 3, 4, 5], SPEC).to_wire())
    req = inbound.parse_generate(msg)
    assert (req.request_id, req.input_ids) == ("r1", [1, 2, 3, 4, 5])
    assert req.spec == SPEC
    assert proto.generate("r1", [1], SAMPLING)["sampling"] == msg["sampling"]


def test_a_handoff_with_every_field_rebuilds_the_same_spec(tok):
    prompt = tok.encode("Give me JSON:").ids
    seq = Sequence("r1", prompt, SPEC)
    seq.output_ids = tok.encode('{"a": ', add_special_tokens=False).ids
    seq.slo_class = "feasible"  # NOTE: the class as the scheduler left it travels
    seq.num_computed = len(seq.prompt_ids) + len(seq.output_ids) - 1
    got = handoff_sequence(roundtrip(handoff_meta(seq, target=3)))
    assert got.spec == replace(SPEC, slo_class="feasible")
    assert (got.request_id, got.prompt_ids, got.output_ids) == (
        "r1",
        seq.prompt_ids,
        seq.output_ids,
    )


def test_the_encoder_writes_the_routers_generate_exactly():
    """The golden `generate` (as the router sends it) decodes and encodes back key for key."""
    wire = golden_generate().to_wire()
    spec = Generate.from_wire(roundtrip(wire)).spec()
    assert Generate.of(wire["request_id"], wire["input_ids"], spec).to_wire() == wire
    plain = Generate.of("r", [1], replace(spec, sampling=SamplingParams())).to_wire()
    assert "grammar" not in plain


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"sampling": {"logit_bias": [[7, "x"]]}}, "sampling.logit_bias[0][1]"),
        ({"sampling": {"bad_words": [13]}}, "sampling.bad_words[0]"),
        ({"stop": {"ignore_eos": 1}}, "stop.ignore_eos"),
        ({"stop": {"max_tokens": True}}, "stop.max_tokens"),
        ({"sampling": [1]}, "sampling"),
        ({"contract": {"preempt": "no"}}, "contract.preempt"),
        ({"grammar": {"kind": 3}}, "grammar.kind"),
    ],
)
def test_a_bad_field_is_named_alike_on_both_paths(change, field):
    good = Generate.of("r1", [1], SPEC).to_wire()
    with pytest.raises(ProtocolError) as by_router:
        inbound.parse_generate(good | change)
    seq = Sequence("r1", [1], SPEC)
    meta = handoff_meta(seq, target=3)
    with pytest.raises(ProtocolError) as by_handoff:
        handoff_sequence(meta | {"spec": meta["spec"] | change})
    assert str(by_router.value) == str(by_handoff.value)
    assert str(by_router.value).startswith(f"generate: {field} must be ")


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"top_a": 0.5}, "top_a"),
        ({"sampling": {"no_repeat_ngram": 2}}, "sampling.no_repeat_ngram"),
        ({"stop": {"stop_strings": ["x"]}}, "stop.stop_strings"),
        ({"contract": {"deadline_ms": 5}}, "contract.deadline_ms"),
        ({"routing": {"kv_source": 1}}, "routing.kv_source"),
        ({"grammar": {"kind": "regex", "schema": "a", "replay": 0, "flags": "i"}}, "grammar.flags"),
    ],
)
def test_a_field_the_worker_does_not_know_is_refused_by_name(extra, field):
    """A router newer than this worker asking for something it lacks gets an error naming the
    field, not a request served without it (the contract's maps are closed)."""
    good = Generate.of("r1", [1], SPEC).to_wire()
    changed = good | {k: (good.get(k) or {}) | v if isinstance(v, dict) else v
                      for k, v in extra.items()}  # fmt: skip
    with pytest.raises(ProtocolError) as e:
        inbound.parse_generate(changed)
    assert e.value.field == field
    assert "not a field this worker knows" in str(e.value)
    assert inbound.parse_generate(good).spec == SPEC  # the same message without it decodes
