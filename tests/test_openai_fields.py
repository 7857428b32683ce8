"""vLLM's request fields (and OpenAI's newer ones) end to end: one `nitsum serve` on the
embedded SmolLM2 with one CPU worker, driven by the `openai` client through `extra_body`
(docs/serving.md "vLLM request fields"). Every test checks values: token ids, texts, counts.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest
from tokenizers import Tokenizer

from serve_launch import serving

pytestmark = pytest.mark.slow

ASK = [{"role": "user", "content": "Name a large city in France."}]


@pytest.fixture(scope="module")
def base(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    work = tmp_path_factory.mktemp("fields")
    flags = ("--model", str(smollm2_dir), "--workers", "1", "--kv-cache-mb", "64")
    with serving(work, *flags) as (url, _):
        yield url


@pytest.fixture(scope="module")
def tok(smollm2_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(smollm2_dir / "tokenizer.json"))


@pytest.fixture(scope="module")
def client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key="none", timeout=120, max_retries=0)


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def chat(client: openai.OpenAI, model: str, messages=ASK, **extra):
    """A greedy chat completion with `extra` sent as vLLM's extension fields."""
    kw = {k: extra.pop(k) for k in ("max_tokens", "stop", "logprobs", "top_logprobs") if k in extra}
    kw.setdefault("max_tokens", 12)
    return client.chat.completions.create(
        model=model, messages=messages, temperature=0, extra_body=extra, **kw
    )


def raw(base: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{base}{path}", json=body, timeout=120)


def test_structured_fields_constrain_the_output(client, model) -> None:
    r = chat(client, model, guided_choice=["Paris", "Lyon", "Marseille"], max_tokens=8)
    assert r.choices[0].message.content in {"Paris", "Lyon", "Marseille"}
    r = chat(client, model, guided_regex="[0-9]{3}-[a-z]{2}", max_tokens=10)
    assert re.fullmatch("[0-9]{3}-[a-z]{2}", r.choices[0].message.content)
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
        "additionalProperties": False,
    }
    r = chat(client, model, guided_json=schema, max_tokens=30)
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    r = chat(client, model, structured_outputs={"choice": ["yes", "no"]}, max_tokens=4)
    assert r.choices[0].message.content in {"yes", "no"}
    grammar = 'start: "ab" NUM\nNUM: /[0-9]/'
    r = chat(client, model, guided_grammar=grammar, max_tokens=6)
    assert re.fullmatch("ab[0-9]", r.choices[0].message.content)


def test_conflicting_or_unservable_fields_are_400s_naming_them(base, model) -> None:
    body = {"model": model, "messages": ASK, "max_tokens": 4}
    cases = [
        ({"guided_regex": "a+", "guided_choice": ["b"]}, "guided_regex"),
        ({"guided_regex": "a+", "response_format": {"type": "json_object"}}, "guided_regex"),
        ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs.structural_tag"),
        ({"stream": True, "stream_options": {"include_usage": True, "x": 1}}, "stream_options.x"),
        ({"verbosity": "loud"}, "verbosity"),
        ({"allowed_token_ids": [10**7]}, "allowed_token_ids"),
        ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
        ({"prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
    ]
    for extra, param in cases:
        r = raw(base, "/v1/chat/completions", body | extra)
        assert r.status_code == 400, (extra, r.text)
        assert r.json()["error"]["param"] == param, (extra, r.text)


def test_openai_accepted_fields_and_request_id(client, model, base) -> None:
    r = chat(
        client, model, request_id="mine-1", prompt_cache_key="k", safety_identifier="u",
        verbosity="high", max_tokens=3,
    )  # fmt: skip
    assert r.id == "chatcmpl-mine-1"
    # The same request id twice at once: both are served (the router's ids stay its own).
    with ThreadPoolExecutor(2) as pool:
        both = list(pool.map(lambda _: chat(client, model, request_id="dup", max_tokens=3), [0, 1]))
    assert [b.id for b in both] == ["chatcmpl-dup"] * 2
    assert both[0].choices[0].message.content == both[1].choices[0].message.content
    c = raw(base, "/v1/completions", {"model": model, "prompt": "Hi", "request_id": "c7"})
    assert c.json()["id"] == "cmpl-c7"


def test_return_token_ids_are_the_tokenizers(client, model, base, tok) -> None:
    r = chat(client, model, return_token_ids=True, max_tokens=6)
    want = raw(base, "/tokenize", {"model": model, "messages": ASK}).json()["tokens"]
    assert r.model_extra["prompt_token_ids"] == want
    ids = r.choices[0].model_extra["token_ids"]
    assert len(ids) == r.usage.completion_tokens
    assert tok.decode(ids) == r.choices[0].message.content


def test_allowed_token_ids_and_special_tokens_in_text(client, model, tok) -> None:
    end = tok.token_to_id("<|im_end|>")
    a, b = tok.token_to_id("a"), tok.token_to_id("b")
    r = chat(client, model, allowed_token_ids=[a, b], return_token_ids=True, max_tokens=5)
    assert set(r.choices[0].model_extra["token_ids"]) <= {a, b}
    # Only the end token, generated past EOS: its text shows only when asked.
    only_end = {"allowed_token_ids": [end], "ignore_eos": True, "max_tokens": 2}
    assert chat(client, model, **only_end).choices[0].message.content == ""
    kept = chat(client, model, skip_special_tokens=False, **only_end)
    assert kept.choices[0].message.content == "<|im_end|><|im_end|>"


def test_bad_words_are_never_generated(client, model, tok) -> None:
    plain = chat(client, model, return_token_ids=True, max_tokens=8)
    word = plain.choices[0].message.content.split()[0]
    banned = {ids[0] for w in (word, " " + word) if len(ids := tok.encode(w).ids) == 1}
    assert banned, word  # the model's first word is one token (with or without a space)
    assert banned & set(plain.choices[0].model_extra["token_ids"])
    r = chat(client, model, bad_words=[word], return_token_ids=True, max_tokens=8)
    assert not banned & set(r.choices[0].model_extra["token_ids"])


def test_include_stop_str_in_output_keeps_the_stop(client, model) -> None:
    full = chat(client, model, max_tokens=16).choices[0].message.content
    stop = full.split()[1]  # the second word
    cut = full[: full.index(stop)]
    assert chat(client, model, stop=[stop], max_tokens=16).choices[0].message.content == cut
    kept = chat(client, model, stop=[stop], include_stop_str_in_output=True, max_tokens=16)
    assert kept.choices[0].message.content == cut + stop
    assert kept.choices[0].finish_reason == "stop"


def test_logprob_fields(client, model, base) -> None:
    r = chat(client, model, prompt_logprobs=2, max_tokens=2)
    plp = r.model_extra["prompt_logprobs"]
    prompt = raw(base, "/tokenize", {"model": model, "messages": ASK}).json()["tokens"]
    assert len(plp) == len(prompt) == r.usage.prompt_tokens and plp[0] is None
    for token, entry in zip(prompt[1:], plp[1:], strict=True):
        assert str(token) in entry and all(v["logprob"] <= 0 for v in entry.values())
        assert sorted({v["rank"] for v in entry.values()})[:2] == [1, 2]
    r = chat(
        client, model, logprobs=True, top_logprobs=2, return_tokens_as_token_ids=True,
        return_token_ids=True, max_tokens=4,
    )  # fmt: skip
    ids = r.choices[0].model_extra["token_ids"]
    assert [c.token for c in r.choices[0].logprobs.content] == [f"token_id:{i}" for i in ids]
    assert all(t.token.startswith("token_id:") for c in r.choices[0].logprobs.content
               for t in c.top_logprobs)  # fmt: skip


def test_truncate_prompt_tokens_keeps_the_last_ones(base, model, tok) -> None:
    prompt = "one two three four five six seven eight nine ten eleven twelve"
    body = {"model": model, "prompt": prompt, "max_tokens": 2, "temperature": 0}
    r = raw(base, "/v1/completions", body | {"truncate_prompt_tokens": 5, "return_token_ids": True})
    assert r.status_code == 200, r.text
    ids = tok.encode(prompt).ids
    assert r.json()["prompt_token_ids"] == ids[-5:]
    assert r.json()["usage"]["prompt_tokens"] == 5
    # The same as sending those 5 ids.
    same = raw(base, "/v1/completions", body | {"prompt": ids[-5:]}).json()
    assert same["choices"][0]["text"] == r.json()["choices"][0]["text"]


def long_ask() -> list[dict]:
    """A ~300-token prompt no other request shares a page with (its system message, right
    after the template's first 3 tokens, is fresh for every run)."""
    words = " ".join(f"item{i}" for i in range(80))
    return [
        {"role": "system", "content": uuid.uuid4().hex},
        {"role": "user", "content": f"Summarize: {words}"},
    ]


def cached(r) -> int:
    return r.usage.prompt_tokens_details.cached_tokens


def test_cached_tokens_and_cache_salt_isolation(client, model, base) -> None:
    msgs = long_ask()
    first = chat(client, model, msgs, max_tokens=2)
    n = first.usage.prompt_tokens
    assert n > 250 and cached(first) == 0
    # The repeat reuses every full page of the prompt but the last token's (16-token pages).
    again = chat(client, model, msgs, max_tokens=2)
    assert cached(again) >= (n - 1) // 16 * 16 - 16 and cached(again) > 200
    # Another salt shares nothing with the unsalted run; the same salt shares its own.
    assert cached(chat(client, model, msgs, cache_salt="a", max_tokens=2)) == 0
    assert cached(chat(client, model, msgs, cache_salt="b", max_tokens=2)) == 0
    assert cached(chat(client, model, msgs, cache_salt="a", max_tokens=2)) >= cached(again)
    # /generate reports it as meta_info.cached_tokens.
    ids = raw(base, "/tokenize", {"model": model, "messages": msgs}).json()["tokens"]
    gen = {"input_ids": ids, "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
    assert raw(base, "/generate", gen).json()["meta_info"]["cached_tokens"] >= cached(again)


def test_continuous_usage_stats_on_every_chunk(client, model) -> None:
    stream = client.chat.completions.create(
        model=model, messages=ASK, max_tokens=6, temperature=0, stream=True,
        extra_body={"stream_options": {"include_usage": True, "continuous_usage_stats": True},
                    "return_token_ids": True},
    )  # fmt: skip
    chunks = list(stream)
    with_choices = [c for c in chunks if c.choices]
    assert with_choices and all(c.usage is not None for c in with_choices)
    counts = [c.usage.completion_tokens for c in with_choices]
    assert counts == sorted(counts)
    final = chunks[-1]
    assert not final.choices and final.usage.completion_tokens == counts[-1] == 6
    streamed = [i for c in with_choices for i in c.choices[0].model_extra.get("token_ids", [])]
    assert len(streamed) == 6
