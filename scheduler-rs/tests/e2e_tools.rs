//! Tools on a template that cannot render them, per-request chat templates, and the
//! Responses API: HTTP → router → mock worker (which echoes the prompt) → HTTP.

mod common;

use common::*;
use nitsum_scheduler::config::{OutputParsers, RouterConfig};
use nitsum_scheduler::mock_worker::MockOptions;
use nitsum_scheduler::parsers::tool_calls::ToolParser;
use serde_json::{json, Value};

fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}}},
           {"type": "function", "function": {"name": "now"}}])
}

/// A template that renders only the last message, so the echo is exactly its content.
const LAST_ONLY: &str = "{{ messages[-1]['content'] }}<|im_end|>";

/// The JSON schema of the grammar the worker was sent for `body`.
async fn forced_schema(r: &Router, mut body: Value) -> Value {
    body["max_tokens"] = json!(2);
    let resp = post(r, "/v1/chat/completions", body).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    let g = r.mocks[0]
        .stats
        .last_grammar
        .lock()
        .unwrap()
        .clone()
        .unwrap();
    serde_json::from_str(g.schema.as_deref().unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tool_list_goes_into_the_system_prompt_and_forced_calls_get_a_grammar() {
    // NOTE: `tools` without `tool_choice` is `auto`, served with a parser (e2e_parsers.rs).
    let parsers = OutputParsers {
        tool_calls: Some(ToolParser::Hermes),
        auto_tool_choice: true,
        ..OutputParsers::default()
    };
    let cfg = RouterConfig {
        parsers,
        ..config()
    };
    let r = start(cfg, &[MockOptions::default()]).await;
    // NOTE: the tiny model's context is 64 tokens: templates that render a slice of the
    // prompt (the mock echoes it) keep requests within it.
    let head = "{{ messages[0]['role'] }}:{{ messages[0]['content'][:24] }}<|im_end|>";
    let body = json!({"model": "tiny", "messages": [{"role": "user", "content": "Oslo?"}],
                      "tools": tools(), "chat_template": head});
    let v = post(&r, "/v1/chat/completions", body.clone()).await.json();
    // The tools went into a new first system message.
    let content = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(content, "system:# Tools\n\nYou can call fu", "{v}");
    assert_eq!(*r.mocks[0].stats.last_grammar.lock().unwrap(), None);
    let mut body = body;
    body["chat_template"] = json!(LAST_ONLY);
    let mut named = body.clone();
    named["tool_choice"] = json!({"type": "function", "function": {"name": "get_weather"}});
    let s = forced_schema(&r, named).await;
    assert_eq!(s["properties"]["name"], json!({"const": "get_weather"}));
    let mut required = body.clone();
    required["tool_choice"] = json!("required");
    let s = forced_schema(&r, required.clone()).await;
    assert_eq!(
        (s["type"].as_str(), &s["minItems"]),
        (Some("array"), &json!(1))
    );
    required["parallel_tool_calls"] = json!(false);
    let s = forced_schema(&r, required).await;
    assert_eq!(s["anyOf"].as_array().unwrap().len(), 2, "{s}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kwargs_reach_the_template_and_bad_template_fields_are_400s() {
    let r = start(config(), &[MockOptions::default()]).await;
    // NOTE: parsing calls out of an echo does not fit the tiny model's 64 tokens; the
    // parsing is unit-tested in api/tool_reply.rs and end to end in test_responses_api.py.
    let kw = json!({"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                    "chat_template": "{{ greeting }}<|im_end|>",
                    "chat_template_kwargs": {"greeting": "hello"}});
    let v = post(&r, "/v1/chat/completions", kw).await.json();
    assert_eq!(v["choices"][0]["message"]["content"], "hello");
    for (extra, param) in [
        (json!({"chat_template": "{% if %}"}), "chat_template"),
        (
            json!({"chat_template_kwargs": {"messages": []}}),
            "chat_template_kwargs",
        ),
        (json!({"chat_template_kwargs": [1]}), "chat_template_kwargs"),
        (
            json!({"tools": tools(), "parallel_tool_calls": "x"}),
            "parallel_tool_calls",
        ),
    ] {
        let mut b = json!({"model": "tiny", "messages": [{"role": "user", "content": "x"}]});
        b.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let resp = post(&r, "/v1/chat/completions", b).await;
        assert_eq!(resp.status, 400, "{}", resp.body);
        assert_eq!(resp.json()["error"]["param"], param, "{}", resp.body);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_answer_objects_and_event_streams() {
    let r = start(config(), &[MockOptions::default()]).await;
    let v = post(
        &r,
        "/v1/responses",
        json!({"model": "tiny", "input": "hé", "max_output_tokens": 3}),
    )
    .await
    .json();
    assert_eq!(
        (v["object"].as_str(), v["status"].as_str()),
        (Some("response"), Some("incomplete"))
    );
    assert_eq!(v["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(v["output"][0]["content"][0]["type"], "output_text");
    assert_eq!(v["usage"]["output_tokens"], 3);
    let body = json!({"model": "tiny", "input": "abc", "chat_template": LAST_ONLY,
                      "stream": true});
    let resp = post(&r, "/v1/responses", body).await;
    let events = resp.sse_chunks();
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds[..4],
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added"
        ],
        "{}",
        resp.body
    );
    assert_eq!(
        kinds[kinds.len() - 4..],
        [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed"
        ],
        "{}",
        resp.body
    );
    let seq: Vec<u64> = events
        .iter()
        .map(|e| e["sequence_number"].as_u64().unwrap())
        .collect();
    assert_eq!(seq, (0..events.len() as u64).collect::<Vec<u64>>());
    let deltas: String = events
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    assert_eq!(deltas, "abc");
    let done = &events[events.len() - 1]["response"];
    assert_eq!(done["output"][0]["content"][0]["text"], "abc");
    assert_eq!(done["usage"]["output_tokens"], 4); // "abc" and <|im_end|>
    let bad = post(
        &r,
        "/v1/responses",
        json!({"model": "tiny", "input": "x", "text": {"format": {"type": "json_schema",
                          "name": "s", "schema": [1]}}}),
    )
    .await;
    assert_eq!(
        (bad.status, bad.json()["error"]["param"].as_str()),
        (400, Some("text.format"))
    );
}
