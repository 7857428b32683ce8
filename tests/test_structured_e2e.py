"""Structured output and tool calls end to end: `nitsum serve` (Rust router + 1 CPU worker)
driven by the official `openai` client.

Two servers: the embedded SmolLM2 (its ChatML template renders no `tools`), and a tiny random
Llama over SmolLM2's tokenizer with a Hermes-style template that does. A random model's output
can only be a valid call or schema-valid JSON because of the grammar.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest

from serve_launch import serving
from structured_helpers import tiny_llama

pytestmark = pytest.mark.slow

CITY = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 24},
        "population": {"type": "integer", "minimum": 0, "maximum": 100000000},
        "kind": {"enum": ["capital", "town"]},
    },
    "required": ["city", "population", "kind"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "The capital of France as JSON, with its population."}]
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 16},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Forecast", "parameters": WEATHER},
    },
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
]
# A Hermes-style ChatML template (as Qwen2.5 / Hermes models ship) that renders `tools`.
TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nYou may call these functions:\n<tools>\n"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n</tools>\n"
    'Answer a call as <tool_call>{"name": ..., "arguments": ...}</tool_call><|im_end|>\n'
    "{% endif %}{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def serve(model_dir: Path, work: Path) -> Iterator[str]:
    """`nitsum serve` on `model_dir` with one worker; yields the /v1 base URL."""
    flags = ("--model", str(model_dir), "--workers", "1", "--kv-cache-mb", "64")
    with serving(work, *flags) as (url, _):
        yield f"{url}/v1"


@pytest.fixture(scope="module")
def smol(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from serve(smollm2_dir, tmp_path_factory.mktemp("smol"))


@pytest.fixture(scope="module")
def tools_model(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    out = tmp_path_factory.mktemp("tiny-tools")
    tiny_llama().save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(smollm2_dir / name, out / name)
    (out / "chat_template.jinja").write_text(TOOLS_TEMPLATE)
    yield from serve(out, tmp_path_factory.mktemp("tools"))


def client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base, api_key="none", timeout=120, max_retries=0)


def model_of(base: str) -> str:
    """The served model's name."""
    return client(base).models.list().data[0].id


def schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_schema_constrained_chat_validates(smol: str, temperature: float) -> None:
    r = client(smol).chat.completions.create(
        model=model_of(smol),
        messages=ASK,
        max_tokens=80,
        temperature=temperature,
        seed=3,
        response_format=schema_format(CITY),
    )
    choice = r.choices[0]
    assert choice.finish_reason == "stop", choice
    jsonschema.validate(json.loads(choice.message.content), CITY)


def test_schema_constrained_stream_validates(smol: str) -> None:
    stream = client(smol).chat.completions.create(
        model=model_of(smol),
        messages=ASK,
        max_tokens=80,
        temperature=0,
        response_format=schema_format(CITY),
        stream=True,
    )
    parts, finish = [], None
    for chunk in stream:
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
    assert finish == "stop"
    jsonschema.validate(json.loads("".join(parts)), CITY)


def test_json_object_mode(smol: str) -> None:
    r = client(smol).completions.create(
        model=model_of(smol),
        prompt="A JSON object describing a cat:",
        max_tokens=60,
        temperature=0,
        extra_body={"response_format": {"type": "json_object"}},
    )
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].text), dict)


@pytest.mark.parametrize(
    "body, param, says",
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": [1]}}},
            "response_format",
            "must be an object",
        ),
        (
            {
                "response_format": schema_format(
                    {"type": "object", "properties": {"a": {"type": "nonsense"}}}
                )
            },
            "response_format",
            "nonsense",
        ),
        ({"response_format": {"type": "xml"}}, "response_format", "type"),
        ({"tools": TOOLS, "parallel_tool_calls": "no"}, "parallel_tool_calls", "boolean"),
    ],
)
def test_bad_requests_are_400_naming_the_field(
    smol: str, body: dict, param: str, says: str
) -> None:
    r = httpx.post(
        f"{smol}/chat/completions",
        json={"model": model_of(smol), "messages": ASK, "max_tokens": 4, **body},
        timeout=30,
    )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and says in err["message"], err


def named(name: str) -> dict:
    return {"type": "function", "function": {"name": name}}


@pytest.mark.parametrize("stream", [False, True])
def test_named_tool_choice_yields_a_valid_call(tools_model: str, stream: bool) -> None:
    args = dict(
        model=model_of(tools_model),
        messages=[{"role": "user", "content": "Weather in Oslo for 3 days?"}],
        tools=TOOLS,
        tool_choice=named("get_weather"),
        max_tokens=80,
        temperature=0.7,
        seed=1,
    )
    c = client(tools_model)
    if stream:
        calls: dict[int, dict] = {}
        finish = None
        for chunk in c.chat.completions.create(stream=True, **args):
            if not chunk.choices:
                continue
            for tc in chunk.choices[0].delta.tool_calls or []:
                calls[tc.index] = {
                    "id": tc.id,
                    "name": tc.function.name,
                    "arguments": tc.function.arguments,
                }
            finish = chunk.choices[0].finish_reason or finish
        assert finish == "tool_calls" and list(calls) == [0]
        call = calls[0]
    else:
        r = c.chat.completions.create(**args)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        (tc,) = choice.message.tool_calls
        assert tc.type == "function"
        call = {"id": tc.id, "name": tc.function.name, "arguments": tc.function.arguments}
    assert call["name"] == "get_weather" and call["id"].startswith("call_")
    jsonschema.validate(json.loads(call["arguments"]), WEATHER)


def test_required_tool_choice_calls_one_of_the_tools(tools_model: str) -> None:
    r = client(tools_model).chat.completions.create(
        model=model_of(tools_model),
        messages=[{"role": "user", "content": "What time is it?"}],
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=80,
        temperature=0,
    )
    (tc,) = r.choices[0].message.tool_calls
    assert tc.function.name in {"get_weather", "get_time"}
    schema = WEATHER if tc.function.name == "get_weather" else {"type": "object"}
    jsonschema.validate(json.loads(tc.function.arguments), schema)


def test_unknown_named_tool_is_400(tools_model: str) -> None:
    r = httpx.post(
        f"{tools_model}/chat/completions",
        json={
            "model": model_of(tools_model),
            "messages": ASK,
            "tools": TOOLS,
            "tool_choice": named("nope"),
            "max_tokens": 4,
        },
        timeout=30,
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice", r.text


def check_chat_logprobs(content: str, entries: list, top: int) -> None:
    """A choice's chat `logprobs.content`: one entry per token, spelling its text."""
    assert entries, "no logprobs"
    for e in entries:
        assert -9999.0 <= e.logprob <= 0.0 and len(e.top_logprobs) == top, e
    if content.isascii():
        assert "".join(e.token for e in entries) == content


@pytest.mark.parametrize("stream", [False, True])
def test_schema_with_logprobs_and_two_choices(smol: str, stream: bool) -> None:
    # Structured output, logprobs and n > 1 together: every choice follows the schema and
    # carries its own tokens' logprobs (those of the grammar-masked distribution).
    args = dict(
        model=model_of(smol),
        messages=ASK,
        max_tokens=80,
        temperature=0.8,
        seed=11,
        n=2,
        logprobs=True,
        top_logprobs=2,
        response_format=schema_format(CITY),
    )
    c = client(smol)
    if stream:
        text: dict[int, str] = {0: "", 1: ""}
        lps: dict[int, list] = {0: [], 1: []}
        finish: dict[int, str] = {}
        for chunk in c.chat.completions.create(stream=True, **args):
            for ch in chunk.choices:
                text[ch.index] += ch.delta.content or ""
                lps[ch.index] += ch.logprobs.content if ch.logprobs else []
                if ch.finish_reason:
                    finish[ch.index] = ch.finish_reason
        choices = [(text[i], lps[i], finish[i]) for i in (0, 1)]
    else:
        r = c.chat.completions.create(**args)
        assert [ch.index for ch in r.choices] == [0, 1]
        choices = [(ch.message.content, ch.logprobs.content, ch.finish_reason) for ch in r.choices]
        assert r.usage.completion_tokens == sum(len(lp) for _, lp, _ in choices)
    for content, entries, finish_reason in choices:
        assert finish_reason == "stop", content
        jsonschema.validate(json.loads(content), CITY)
        check_chat_logprobs(content, entries, 2)
    # A forced token (a key name the schema fixes) is certain under the grammar's mask.
    assert any(e.logprob == 0.0 for _, entries, _ in choices for e in entries)


def test_json_object_completion_with_logprobs_and_two_choices(smol: str) -> None:
    r = client(smol).completions.create(
        model=model_of(smol),
        prompt="A JSON object describing a cat:",
        max_tokens=60,
        temperature=0.7,
        seed=4,
        n=2,
        logprobs=2,
        extra_body={"response_format": {"type": "json_object"}},
    )
    assert len(r.choices) == 2
    for ch in r.choices:
        assert ch.finish_reason == "stop", ch.text
        assert isinstance(json.loads(ch.text), dict)
        lp = ch.logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) > 0
        assert all(1 <= len(top) <= 2 for top in lp.top_logprobs)
        assert lp.text_offset[0] == 0


@pytest.mark.parametrize("stream", [False, True])
def test_forced_tool_call_with_logprobs_and_two_choices(tools_model: str, stream: bool) -> None:
    # Each choice's text is held back until its call is read (per choice), and its tokens'
    # logprobs come with its closing delta; call ids differ between choices.
    args = dict(
        model=model_of(tools_model),
        messages=[{"role": "user", "content": "Weather in Oslo for 3 days?"}],
        tools=TOOLS,
        tool_choice=named("get_weather"),
        max_tokens=80,
        temperature=0.7,
        seed=2,
        n=2,
        logprobs=True,
    )
    c = client(tools_model)
    calls: dict[int, dict] = {}
    counts: dict[int, int] = {0: 0, 1: 0}
    if stream:
        finish: dict[int, str] = {}
        for chunk in c.chat.completions.create(stream=True, **args):
            for ch in chunk.choices:
                for tc in ch.delta.tool_calls or []:
                    calls[ch.index] = {"id": tc.id, "name": tc.function.name,
                                       "arguments": tc.function.arguments}  # fmt: skip
                counts[ch.index] += len(ch.logprobs.content) if ch.logprobs else 0
                if ch.finish_reason:
                    finish[ch.index] = ch.finish_reason
        assert finish == {0: "tool_calls", 1: "tool_calls"}
    else:
        r = c.chat.completions.create(**args)
        for ch in r.choices:
            assert ch.finish_reason == "tool_calls" and ch.message.content is None
            (tc,) = ch.message.tool_calls
            calls[ch.index] = {"id": tc.id, "name": tc.function.name,
                               "arguments": tc.function.arguments}  # fmt: skip
            counts[ch.index] = len(ch.logprobs.content)
            assert all(e.top_logprobs == [] for e in ch.logprobs.content)
    assert sorted(calls) == [0, 1] and calls[0]["id"] != calls[1]["id"]
    for call in calls.values():
        assert call["name"] == "get_weather"
        jsonschema.validate(json.loads(call["arguments"]), WEATHER)
    assert counts[0] > 0 and counts[1] > 0
