//! Tools on a template that cannot render them, per-request chat templates, and the
//! Responses API: HTTP → router → mock worker (which echoes the prompt) → HTTP.

mod common;

use common::*;
use nitsum_scheduler::mock_worker::MockOptions;
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
    let r = start(config(), &[MockOptions::default()]).await;
    let body = json!({"model": "tiny", "messages": [{"role": "user", "content": "Oslo?"}],
                      "tools": tools()});
    let v = post(&r, "/v1/chat/completions", body.clone()).await.json();
    // The echo stops at the first <|im_end|>: the system message the tools were put in.
    let content = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(content.starts_with("system\n# Tools"), "{content}");
    assert!(content.contains(r#""name":"get_weather""#), "{content}");
    assert!(content.contains(r#""required":["city"]"#), "{content}");
    assert!(content.contains("<tool_call>"), "{content}");
    assert_eq!(*r.mocks[0].stats.last_grammar.lock().unwrap(), None);
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
async fn auto_replies_are_parsed_for_several_calls_and_kwargs_reach_the_template() {
    let r = start(config(), &[MockOptions::default()]).await;
    let said = "Two.<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>\
                <tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}</tool_call>";
    let body = json!({"model": "tiny", "messages": [{"role": "user", "content": said}],
                      "tools": tools(), "chat_template": LAST_ONLY});
    let v = post(&r, "/v1/chat/completions", body.clone()).await.json();
    let msg = &v["choices"][0]["message"];
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{v}");
    assert_eq!(msg["content"], "Two.");
    let calls = msg["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[1]["function"]["arguments"], r#"{"city":"Oslo"}"#);
    let mut one = body.clone();
    one["parallel_tool_calls"] = json!(false);
    let v = post(&r, "/v1/chat/completions", one).await.json();
    assert_eq!(
        v["choices"][0]["message"]["tool_calls"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
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
    let said = "<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>";
    let body = json!({"model": "tiny", "input": [{"role": "user", "content": said}],
                      "tools": [{"type": "function", "name": "now"}], "chat_template": LAST_ONLY,
                      "stream": true});
    let resp = post(&r, "/v1/responses", body).await;
    let events = resp.sse_chunks();
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
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
    assert_eq!(seq, (0..7).collect::<Vec<u64>>());
    let done = &events[6]["response"];
    assert_eq!(done["output"][0]["name"], "now");
    assert_eq!(done["output"][0]["arguments"], "{}");
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
