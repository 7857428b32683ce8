"""Structured output in the engine: a tiny random Llama over the embedded model's tokenizer
produces, under a grammar, output that parses and validates against the schema (greedy and
sampled, batched with unconstrained requests), ends with "stop" when the grammar is done, and
a resumed request (its output so far replayed into the grammar) goes on exactly as before."""

from __future__ import annotations

import json

import jsonschema
import pytest
from tokenizers import Tokenizer

from nitsum.engine.request_spec import RequestSpec
from nitsum.errors import InvalidRequestError
from nitsum.sampling import SamplingParams
from nitsum.structured import compiler
from nitsum.structured.compiler import GrammarCompiler
from nitsum.structured.spec import GrammarSpec
from structured_helpers import EOS, run, tiny_engine, tiny_llama, tokenizer_json

SCHEMAS = {
    "required_fields": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "ok": {"type": "boolean"},
        },
        "required": ["name", "ok"],
        "additionalProperties": False,
    },
    "enum": {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}},
        "required": ["color"],
        "additionalProperties": False,
    },
    "integer_range": {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": -5, "maximum": 120}},
        "required": ["n"],
        "additionalProperties": False,
    },
    "array": {
        "type": "object",
        "properties": {
            "xs": {
                "type": "array",
                "items": {"type": "integer", "minimum": 0, "maximum": 9},
                "minItems": 2,
                "maxItems": 4,
            }
        },
        "required": ["xs"],
        "additionalProperties": False,
    },
}
PROMPT = [1, 504, 3145, 314, 260, 1789, 30, 2]


@pytest.fixture(scope="module")
def tok(smollm2_dir) -> Tokenizer:
    return Tokenizer.from_file(str(smollm2_dir / "tokenizer.json"))


@pytest.fixture(scope="module")
def hf():
    return tiny_llama()


@pytest.fixture(autouse=True)
def grammars(smollm2_dir):
    compiler.use(GrammarCompiler(tokenizer_json(smollm2_dir), [EOS]))
    yield
    compiler.use(None)


def grammar(schema: dict) -> GrammarSpec:
    return GrammarSpec("json_schema", json.dumps(schema))


def text_of(tok: Tokenizer, ids: list[int]) -> str:
    return tok.decode([t for t in ids if t != EOS])


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_schema_output_parses_and_validates(hf, tok, temperature) -> None:
    engine = tiny_engine(hf)
    for name, schema in SCHEMAS.items():
        sp = SamplingParams(
            max_tokens=120, temperature=temperature, seed=7, grammar=grammar(schema)
        )
        engine.add_request(name, PROMPT, RequestSpec(sp))
    # An unconstrained request in the same batches is untouched by the masks.
    engine.add_request(
        "free", PROMPT, RequestSpec(SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))
    )
    outs, reasons = run(engine)
    for name, schema in SCHEMAS.items():
        text = text_of(tok, outs[name])
        assert reasons[name] == "stop", (name, text)
        jsonschema.validate(json.loads(text), schema)
    alone = tiny_engine(hf)
    alone.add_request(
        "free", PROMPT, RequestSpec(SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))
    )
    assert outs["free"] == run(alone)[0]["free"]


def test_json_object_output_stays_inside_the_grammar(hf, tok) -> None:
    # Any object: a random model may write one endless key (nothing in "any object" bounds
    # it), so the output is checked as what the grammar accepts so far, and complete if
    # the request stopped.
    engine = tiny_engine(hf)
    for seed in range(3):
        sp = SamplingParams(
            max_tokens=60, temperature=1.0, seed=seed, grammar=GrammarSpec("json_object")
        )
        engine.add_request(f"o{seed}", PROMPT, RequestSpec(sp))
    outs, reasons = run(engine)
    for rid, ids in outs.items():
        fresh = compiler.current().matcher(GrammarSpec("json_object"))
        body = [t for t in ids if t != EOS]
        assert fresh.consume(body), (rid, text_of(tok, ids))
        assert text_of(tok, ids).startswith("{")
        if reasons[rid] == "stop":
            assert fresh.accepting and isinstance(json.loads(text_of(tok, ids)), dict)
        else:
            assert reasons[rid] == "length" and len(ids) == 60


def test_without_the_grammar_the_model_emits_no_json(hf, tok) -> None:
    # The test above can fail: the random model alone does not write valid JSON.
    engine = tiny_engine(hf)
    engine.add_request("free", PROMPT, RequestSpec(SamplingParams(max_tokens=30, temperature=0)))
    outs, _ = run(engine)
    with pytest.raises(ValueError):
        json.loads(text_of(tok, outs["free"]))


def test_resume_replays_the_output_into_the_grammar(hf) -> None:
    schema = SCHEMAS["array"]
    engine = tiny_engine(hf)
    engine.add_request(
        "whole",
        PROMPT,
        RequestSpec(SamplingParams(max_tokens=120, temperature=0, grammar=grammar(schema))),
    )
    whole = run(engine)[0]["whole"]
    assert len(whole) > 4
    # As the router resumes it on another worker: prompt ‖ the first 3 tokens, replay 3.
    k = 3
    spec = GrammarSpec("json_schema", json.dumps(schema), replay=k)
    engine.add_request(
        "rest",
        PROMPT + whole[:k],
        RequestSpec(SamplingParams(max_tokens=120, temperature=0, grammar=spec)),
    )
    assert run(engine)[0]["rest"] == whole[k:]


def test_preempted_sequences_keep_their_grammar_state(hf, tok) -> None:
    # A KV pool of 12 pages of 4 tokens: 4 sequences do not fit at once, so some are
    # preempted (recomputed) and come back; their output is what an ample pool gives.
    schema = SCHEMAS["required_fields"]

    def outputs(engine) -> dict[str, list[int]]:
        for i in range(4):
            sp = SamplingParams(max_tokens=36, temperature=0, grammar=grammar(schema))
            engine.add_request(f"r{i}", PROMPT[:-1] + [100 + i], RequestSpec(sp))
        return run(engine)[0]

    small = tiny_engine(hf, kv_cache_bytes=12 * 2048, page_tokens=4, prefix_caching=False)
    assert small.scheduler.pages.num_pages == 12
    squeezed = outputs(small)
    assert small.counters()["num_preemptions"] > 0
    assert squeezed == outputs(tiny_engine(hf, page_tokens=4))
    for ids in squeezed.values():
        jsonschema.validate(json.loads(text_of(tok, ids)), schema)


def test_bad_grammars_are_refused_at_add(hf) -> None:
    engine = tiny_engine(hf)
    bad = GrammarSpec(
        "json_schema", json.dumps({"type": "object", "properties": {"a": {"type": "x"}}})
    )
    with pytest.raises(InvalidRequestError) as e:
        engine.add_request("b", PROMPT, RequestSpec(SamplingParams(grammar=bad)))
    assert e.value.field == "response_format"
    broken = GrammarSpec("json_object", replay=2)  # the prompt's last 2 tokens are no object
    with pytest.raises(InvalidRequestError, match="replayed output"):
        engine.add_request("c", PROMPT, RequestSpec(SamplingParams(grammar=broken)))
    assert not engine.has_unfinished()


def test_grammar_combines_with_logprobs_processors_and_forks(hf, tok) -> None:
    # n = 2 choices of one prompt under one schema, with logprobs, a logit_bias and a
    # penalty: the second choice shares the first one's prefill (engine/forks.py); the
    # grammar's mask comes after the processors (a +100 bias on EOS, which the grammar
    # forbids until the object is complete, changes nothing), and logprobs are those of the
    # masked distribution (a forced token has logprob 0, its alternatives the floor).
    from nitsum.sampling_logprobs import LOGPROB_FLOOR

    schema = SCHEMAS["required_fields"]
    prompt = PROMPT * 3  # several full pages to share
    engine = tiny_engine(hf, page_tokens=4)

    def params(seed: int) -> SamplingParams:
        return SamplingParams(
            max_tokens=60,
            temperature=1.0,
            seed=seed,
            grammar=grammar(schema),
            logprobs=3,
            logit_bias=((EOS, 100.0),),
            frequency_penalty=0.5,
        )

    engine.add_request("c0", prompt, RequestSpec(params(1)))
    engine.add_request("c1", prompt, RequestSpec(params(2), fork_of="c0"))
    ids: dict[str, list[int]] = {"c0": [], "c1": []}
    lps: dict[str, list] = {"c0": [], "c1": []}
    reasons: dict[str, str] = {}
    while engine.has_unfinished():
        for o in engine.step():
            ids[o.request_id] += o.new_token_ids
            lps[o.request_id] += o.logprobs or []
            if o.finished:
                reasons[o.request_id] = o.finish_reason
    assert engine.counters()["prefix_cache_hits"] >= (len(prompt) - 1) // 4 * 4
    forced = 0
    for rid in ("c0", "c1"):
        assert reasons[rid] == "stop", (rid, text_of(tok, ids[rid]))
        jsonschema.validate(json.loads(text_of(tok, ids[rid])), schema)
        assert len(lps[rid]) == len(ids[rid])
        for token, lp in zip(ids[rid], lps[rid], strict=True):
            assert len(lp.top) == 3 and LOGPROB_FLOOR < lp.logprob <= 0.0  # an allowed token
            assert all(LOGPROB_FLOOR <= v <= 0.0 for _, v in lp.top)
            if lp.logprob == 0.0:
                forced += 1
                assert lp.top[0] == (token, 0.0)
                assert [v for _, v in lp.top[1:]] == [LOGPROB_FLOOR, LOGPROB_FLOOR]
    assert forced > 0  # the schema's key names are forced tokens
