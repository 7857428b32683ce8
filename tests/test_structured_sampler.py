"""Structured output at the sampler: the mask keeps exactly the tokens the grammar allows
next, rows without a grammar are untouched, and the wire spec is checked."""

from __future__ import annotations

import json

import pytest
import torch
from tokenizers import Tokenizer

from nitsum.errors import InvalidRequestError
from nitsum.sampling import SamplingParams, sample
from nitsum.structured import compiler
from nitsum.structured.compiler import GrammarCompiler
from nitsum.structured.mask import apply_grammars
from nitsum.structured.spec import GrammarSpec
from structured_helpers import EOS, tokenizer_json

SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 3, "maximum": 7}},
    "required": ["n"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def comp(smollm2_dir) -> GrammarCompiler:
    return GrammarCompiler(tokenizer_json(smollm2_dir), [EOS])


@pytest.fixture(scope="module")
def tok(smollm2_dir) -> Tokenizer:
    return Tokenizer.from_file(str(smollm2_dir / "tokenizer.json"))


def spec(schema: object) -> GrammarSpec:
    return GrammarSpec("json_schema", json.dumps(schema))


def allowed_by_matcher(m, vocab: int) -> set[int]:
    """Independently of the mask: every token the matcher would accept next, one by one."""
    return {t for t in range(vocab) if m.inner.validate_tokens([t]) == 1}


def test_mask_allows_exactly_the_grammars_next_tokens(comp, tok) -> None:
    m = comp.matcher(spec(SCHEMA))
    assert m.consume(tok.encode('{"n": ', add_special_tokens=False).ids)
    vocab = comp.vocab_size
    before = torch.randn(3, vocab, generator=torch.Generator().manual_seed(0))
    # Row 1 has no grammar; row 2 is a fresh matcher for any JSON object.
    fresh = comp.matcher(GrammarSpec("json_object"))
    logits = apply_grammars(before, [m, None, fresh])
    finite = set(torch.isfinite(logits[0]).nonzero().flatten().tolist())
    assert finite == allowed_by_matcher(m, vocab)
    # Only the digits 3..7 may come next (each allowed token is one of them, alone).
    texts = {tok.decode([t]) for t in finite}
    assert texts and texts <= {"3", "4", "5", "6", "7"}, texts
    assert tok.token_to_id("9") not in finite and tok.token_to_id("5") in finite
    # The row without a grammar is bit-identical.
    assert torch.equal(logits[1], before[1])
    assert set(torch.isfinite(logits[2]).nonzero().flatten().tolist()) == allowed_by_matcher(
        fresh, vocab
    )
    # Unmasked values are unchanged.
    assert torch.equal(logits[0][sorted(finite)], before[0][sorted(finite)])


def test_greedy_under_the_mask_picks_the_best_allowed_token(comp, tok) -> None:
    m = comp.matcher(spec(SCHEMA))
    m.consume(tok.encode('{"n": ', add_special_tokens=False).ids)
    logits = torch.zeros(1, comp.vocab_size)
    logits[0, tok.token_to_id("9")] = 100.0  # the model wants 9: not allowed
    logits[0, tok.token_to_id("6")] = 5.0
    assert sample(logits, [SamplingParams(temperature=0)], [None], [m]) == [tok.token_to_id("6")]
    # Sampled rows too: 9 never comes out.
    g = torch.Generator().manual_seed(1)
    for _ in range(20):
        row = torch.randn(1, comp.vocab_size)
        row[0, tok.token_to_id("9")] = 100.0
        (t,) = sample(row, [SamplingParams(temperature=1.0)], [g], [m])
        assert tok.decode([t]) in {"3", "4", "5", "6", "7"}


def test_the_workers_inference_tensors_can_be_masked(comp, tok) -> None:
    # The worker's forward runs under inference_mode; sampling happens outside it.
    m = comp.matcher(spec(SCHEMA))
    m.consume(tok.encode('{"n": ', add_special_tokens=False).ids)
    with torch.inference_mode():
        logits = torch.zeros(2, comp.vocab_size)
        logits[:, tok.token_to_id("9")] = 50.0
    out = sample(logits, [SamplingParams(temperature=0)] * 2, [None] * 2, [m, None])
    assert out == [tok.token_to_id("3"), tok.token_to_id("9")]


def test_eos_is_allowed_only_once_the_object_is_complete(comp, tok) -> None:
    m = comp.matcher(GrammarSpec("json_object"))
    assert EOS not in allowed_by_matcher(m, comp.vocab_size)
    assert m.consume(tok.encode('{"a": 1', add_special_tokens=False).ids)
    assert not m.done and not m.accepting
    assert m.consume(tok.encode("}", add_special_tokens=False).ids)
    assert m.accepting and m.done


def test_a_schema_the_library_rejects_names_response_format(comp) -> None:
    with pytest.raises(InvalidRequestError) as e:
        comp.check(spec({"type": "object", "properties": {"a": {"type": "nonsense"}}}))
    assert e.value.field == "response_format" and "nonsense" in e.value.message


def test_a_json_schema_spec_without_schema_names_response_format(comp) -> None:
    # `from_wire` refuses it; a spec built in code must get the same error, not a TypeError.
    with pytest.raises(InvalidRequestError) as e:
        comp.check(GrammarSpec("json_schema", None))
    assert e.value.field == "response_format" and "schema text" in e.value.message


@pytest.mark.parametrize(
    "raw, why",
    [
        ({"kind": "yaml"}, "kind"),
        ({"kind": "regex"}, "source text"),
        ({"kind": "lark", "schema": ""}, "source text"),
        ({"kind": "json_schema"}, "schema text"),
        ({"kind": "json_schema", "schema": "[1, 2]"}, "JSON object"),
        ({"kind": "json_schema", "schema": "{not json"}, "not JSON"),
        ({"kind": "json_object", "replay": -1}, "replay"),
        ("json", "map"),
    ],
)
def test_malformed_wire_grammars_are_refused(raw, why) -> None:
    with pytest.raises(InvalidRequestError) as e:
        GrammarSpec.from_wire(raw)
    assert e.value.field == "response_format" and why in e.value.message


@pytest.mark.parametrize(
    "spec, field, why",
    [
        ({"kind": "regex"}, "response_format", "source text"),
        ({"kind": "ebnf", "schema": ""}, "sampling_params.ebnf", "source text"),
    ],
)
def test_regex_and_ebnf_grammars_need_their_text(spec, field, why) -> None:
    with pytest.raises(InvalidRequestError) as e:
        GrammarSpec.from_wire(spec)
    assert e.value.field == field and why in e.value.message


def test_regex_and_ebnf_compile_and_bad_ones_name_their_field(comp) -> None:
    comp.check(GrammarSpec("regex", "[0-9]{3}-[a-z]+"))
    comp.check(GrammarSpec("ebnf", 'root ::= "yes" | "no"'))
    for spec, field in [
        (GrammarSpec("regex", "[0-9"), "response_format"),
        (GrammarSpec("ebnf", "root ::= missing_rule"), "sampling_params.ebnf"),
    ]:
        with pytest.raises(InvalidRequestError) as e:
            comp.check(spec)
        assert e.value.field == field, e.value.message


def test_wire_round_trip_and_no_compiler() -> None:
    s = GrammarSpec("json_schema", json.dumps(SCHEMA), replay=4)
    assert GrammarSpec.from_wire(s.to_wire()) == s
    assert GrammarSpec.from_wire(None) is None
    compiler.use(None)
    with pytest.raises(InvalidRequestError, match="no tokenizer"):
        compiler.current()


def test_generate_carries_the_grammar_to_the_workers_sampling_params() -> None:
    from nitsum.worker import inbound, protocol

    g = GrammarSpec("json_schema", json.dumps(SCHEMA), replay=2)
    msg = protocol.decode(
        protocol.encode(protocol.generate("r", [1, 2, 3], SamplingParams(grammar=g)))
    )
    assert msg["grammar"] == {"kind": "json_schema", "schema": json.dumps(SCHEMA), "replay": 2}
    assert inbound.parse_generate(msg).spec.sampling.grammar == g
    plain = protocol.decode(protocol.encode(protocol.generate("r", [1], SamplingParams())))
    assert "grammar" not in plain and inbound.parse_generate(plain).spec.sampling.grammar is None
    with pytest.raises(InvalidRequestError) as e:
        inbound.parse_generate({**plain, "grammar": {"kind": "lark"}})
    assert e.value.field == "response_format"


def test_a_grammar_error_says_why_without_the_parser_state(comp, tok) -> None:
    # A client reads this (400 or a stream's error event): the reason, not llguidance's
    # internal state and the whole grammar.
    m = comp.matcher(spec({"type": "integer"}))
    assert not m.consume(tok.encode("x", add_special_tokens=False).ids)
    assert m.error == "Parser Error: token \"x\" doesn't satisfy the grammar; byte 'x' fails parse"


def test_regex_and_lark_grammars_constrain_the_output(comp, tok) -> None:
    """vLLM's guided_regex / guided_choice / guided_grammar arrive as `regex` and `lark`."""
    digits = comp.matcher(GrammarSpec("regex", "[0-9]{2}"))
    allowed = allowed_by_matcher(digits, comp.vocab_size)
    assert allowed and all(tok.decode([t]).isdigit() for t in allowed)
    assert digits.consume(tok.encode("42", add_special_tokens=False).ids) and digits.accepting
    choice = comp.matcher(GrammarSpec("lark", 'start: "Paris" | "Rome"'))
    # Greedy with the model wanting "Lyon": the best allowed first token is taken.
    logits = torch.zeros(1, comp.vocab_size)
    logits[0, tok.encode("Lyon", add_special_tokens=False).ids[0]] = 100.0
    first = sample(logits, [SamplingParams(temperature=0)], [None], [choice])[0]
    assert "Paris".startswith(tok.decode([first])) or "Rome".startswith(tok.decode([first]))
    with pytest.raises(InvalidRequestError) as e:
        comp.check(GrammarSpec("lark", "root ::= x"))
    assert e.value.field == "response_format" and "lark" in e.value.message
