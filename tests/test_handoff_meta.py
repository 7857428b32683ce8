"""The metadata a prefilled request's KV handoff carries to its decode worker
(pool/handoff_meta.py): the whole RequestSpec and the grammar's state survive the trip
through msgpack (a structured-output request prefilled on one host keeps its grammar on the
other), and an output that breaks the grammar is refused, not decoded unconstrained."""

from __future__ import annotations

from dataclasses import replace

import msgpack
import pytest
from tokenizers import Tokenizer

from nitsum.engine.request_spec import RequestSpec
from nitsum.engine.sequence import Sequence
from nitsum.pool.handoff_meta import handoff_meta, handoff_sequence
from nitsum.sampling import SamplingParams
from nitsum.structured import compiler
from nitsum.structured.compiler import GrammarCompiler
from nitsum.structured.spec import GrammarSpec
from nitsum.structured.start import start_grammar
from structured_helpers import EOS, tokenizer_json


@pytest.fixture(scope="module")
def tok(smollm2_dir) -> Tokenizer:
    compiler.use(GrammarCompiler(tokenizer_json(smollm2_dir), [EOS]))
    yield Tokenizer.from_file(str(smollm2_dir / "tokenizer.json"))
    compiler.use(None)


def handed_over(seq: Sequence) -> Sequence:
    """`seq` as the decode worker rebuilds it, through the wire's msgpack."""
    wire = msgpack.packb(handoff_meta(seq, target=3), use_bin_type=True)
    return handoff_sequence(msgpack.unpackb(wire, raw=False))


def sequence(tok: Tokenizer, output: str) -> Sequence:
    sampling = SamplingParams(
        max_tokens=40,
        temperature=0.5,
        stop_token_ids=(5, 6),
        logit_bias=((7, 2.5),),
        grammar=GrammarSpec("json_object"),
    )
    spec = RequestSpec(
        sampling, tier="gold", ttft_ms=250.0, priority=-2, may_preempt=False, decode_target=3
    )
    seq = Sequence("r1", tok.encode("Give me JSON:").ids, spec)
    seq.output_ids = tok.encode(output, add_special_tokens=False).ids
    seq.slo_class = "background"  # demoted by the scheduler while it prefilled
    seq.num_computed = len(seq.prompt_ids) + len(seq.output_ids) - 1
    return seq


def test_the_spec_and_the_grammar_state_travel_whole(tok) -> None:
    seq = sequence(tok, '{"a": [1, ')
    seq.grammar = start_grammar(seq.sampling.grammar, seq.prompt_ids)
    assert seq.grammar is not None and seq.grammar.consume(seq.output_ids)
    got = handed_over(seq)
    assert got.spec == replace(seq.spec, slo_class="background")
    assert (got.slo_class, got.output_ids) == ("background", seq.output_ids)
    assert got.num_computed == seq.num_computed
    # The receiver's matcher is where the sender's is: it takes what continues the output
    # and refuses what would break it, as the sender's does.
    assert got.grammar is not None and not got.grammar.done
    close = tok.encode("2]}", add_special_tokens=False).ids
    bad = tok.encode("}", add_special_tokens=False).ids
    assert got.grammar.consume(close) and got.grammar.done
    fresh = handed_over(seq)
    assert fresh.grammar is not None and not fresh.grammar.consume(bad)


def test_an_output_that_breaks_the_grammar_is_refused(tok) -> None:
    seq = sequence(tok, "not json at all")
    with pytest.raises(ValueError, match="breaks its grammar"):
        handed_over(seq)


def test_a_request_without_a_grammar_has_none(tok) -> None:
    seq = Sequence("r2", [1, 2, 3], RequestSpec(SamplingParams(max_tokens=4), tier="t"))
    seq.output_ids, seq.num_computed = [9], 3
    got = handed_over(seq)
    assert got.grammar is None and got.spec == seq.spec and got.slo_class == "feasible"
