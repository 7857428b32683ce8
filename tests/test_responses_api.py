"""The Responses API (`POST /v1/responses`) and tools on a template that cannot render them,
end to end: `nitsum serve` with the embedded SmolLM2 (its ChatML template never reads
`tools`, so the tool list goes into the system prompt) driven by the official `openai` client.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import openai
import pytest

from serve_launch import serving

pytestmark = pytest.mark.slow

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 16},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
CHAT_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
]
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 24}, "capital": {"type": "boolean"}},
    "required": ["city", "capital"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def base(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    flags = ("--model", str(smollm2_dir), "--workers", "1", "--kv-cache-mb", "64")
    with serving(tmp_path_factory.mktemp("responses"), *flags) as (url, _):
        yield f"{url}/v1"


def client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base, api_key="none", timeout=120, max_retries=0)


def model_of(base: str) -> str:
    return client(base).models.list().data[0].id


def test_named_and_required_calls_without_template_support(base: str) -> None:
    c = client(base)
    ask = [{"role": "user", "content": "Weather in Oslo for 3 days?"}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = c.chat.completions.create(
        model=model_of(base),
        messages=ask,
        tools=CHAT_TOOLS,
        tool_choice=named,
        max_tokens=60,
        temperature=0,
    )
    (tc,) = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and tc.function.name == "get_weather"
    jsonschema.validate(json.loads(tc.function.arguments), WEATHER)
    r = c.chat.completions.create(
        model=model_of(base),
        messages=ask,
        tools=CHAT_TOOLS,
        tool_choice="required",
        max_tokens=120,
        temperature=0,
    )
    calls = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and len(calls) >= 1, r
    for tc in calls:
        schema = WEATHER if tc.function.name == "get_weather" else {"type": "object"}
        jsonschema.validate(json.loads(tc.function.arguments), schema)


def test_responses_round_trip_with_structured_output(base: str) -> None:
    r = client(base).responses.create(
        model=model_of(base),
        instructions="Answer in JSON.",
        input="Is Paris a capital city?",
        max_output_tokens=60,
        temperature=0,
        text={"format": {"type": "json_schema", "name": "city", "schema": CITY, "strict": True}},
    )
    assert r.object == "response" and r.status == "completed" and r.id.startswith("resp_")
    assert r.instructions == "Answer in JSON."
    jsonschema.validate(json.loads(r.output_text), CITY)
    assert r.output[0].type == "message" and r.output[0].content[0].type == "output_text"
    assert r.usage.input_tokens > 5 and r.usage.output_tokens > 0
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens


def test_responses_stream_and_a_function_call(base: str) -> None:
    c = client(base)
    events = list(
        c.responses.create(
            model=model_of(base),
            input="Say hello.",
            max_output_tokens=8,
            temperature=0,
            stream=True,
        )
    )
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"], kinds
    assert kinds[-1] in ("response.completed", "response.incomplete"), kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = [e.text for e in events if e.type == "response.output_text.done"]
    assert deltas and done == [deltas]
    final = events[-1].response
    assert final.output_text == deltas and final.usage.output_tokens == 8
    tool = {"type": "function", "name": "get_weather", "parameters": WEATHER}
    r = c.responses.create(
        model=model_of(base),
        input="Weather in Oslo for 3 days?",
        tools=[tool],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=60,
        temperature=0,
    )
    (call,) = [o for o in r.output if o.type == "function_call"]
    assert call.name == "get_weather" and call.call_id.startswith("call_resp_")
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model=model_of(base), input="x", previous_response_id="resp_1")
    assert e.value.body["param"] == "previous_response_id"
