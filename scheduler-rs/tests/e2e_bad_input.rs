//! The bad-input suite (issue 11): malformed, out-of-range and unsupported requests each get
//! a clear OpenAI-shaped error naming the field where there is one, nothing is dispatched for
//! them, and a normal request right after each one still answers exactly.

mod common;

use std::sync::atomic::Ordering;

use common::*;
use nitsum_scheduler::mock_worker::MockOptions;
use serde_json::{json, Value};

/// (method, path, content type, body, expected status, expected `error.param` prefix; null:
/// any).
type Case = (&'static str, &'static str, &'static str, String, u16, Value);

const JSON: &str = "application/json";

fn chat(extra: Value) -> String {
    let mut body = json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body.to_string()
}

fn completion(extra: Value) -> String {
    let mut body = json!({"model": "tiny", "prompt": "hi"});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body.to_string()
}

fn generate(sampling: Value) -> String {
    json!({"input_ids": [104, 105], "sampling_params": sampling}).to_string()
}

fn cases() -> Vec<Case> {
    let c = "/v1/chat/completions";
    let p = "/v1/completions";
    let g = "/generate";
    let none = Value::Null;
    let mut v: Vec<Case> = vec![
        // Not JSON, or not an object.
        ("POST", c, JSON, "{not json".into(), 400, none.clone()),
        ("POST", c, JSON, String::new(), 400, none.clone()),
        ("POST", c, JSON, "[]".into(), 400, none.clone()),
        ("POST", c, JSON, "null".into(), 400, none.clone()),
        (
            "POST",
            c,
            JSON,
            "{\"temperature\": NaN}".into(),
            400,
            none.clone(),
        ),
        (
            "POST",
            c,
            JSON,
            "{\"temperature\": 1e999}".into(),
            400,
            none.clone(),
        ),
        ("POST", p, JSON, "\"prompt\"".into(), 400, none.clone()),
        (
            "POST",
            g,
            JSON,
            "{\"input_ids\": [1,".into(),
            400,
            none.clone(),
        ),
        // One JSON value and nothing after it (issue 29 item 7).
        (
            "POST",
            c,
            JSON,
            chat(json!({})) + " {\"model\": \"tiny\"}",
            400,
            none.clone(),
        ),
        (
            "POST",
            p,
            JSON,
            completion(json!({})) + "xyz",
            400,
            none.clone(),
        ),
        (
            "POST",
            g,
            JSON,
            generate(json!({})) + "]",
            400,
            none.clone(),
        ),
        (
            "POST",
            "/tokenize",
            JSON,
            "{\"prompt\": \"hi\"} {}".into(),
            400,
            none.clone(),
        ),
        // Wrong paths and methods.
        ("GET", c, JSON, String::new(), 405, none.clone()),
        ("PUT", g, JSON, generate(json!({})), 405, none.clone()),
        ("POST", "/v1/nope", JSON, chat(json!({})), 404, none.clone()),
        (
            "POST",
            "/v1/embeddings",
            JSON,
            "{}".into(),
            404,
            none.clone(),
        ),
        ("DELETE", "/health", JSON, String::new(), 405, none.clone()),
        // Too big.
        (
            "POST",
            c,
            JSON,
            chat(json!({"pad": "x".repeat(3 << 20)})),
            413,
            none.clone(),
        ),
    ];
    let chat_cases: Vec<(Value, u16, &str)> = vec![
        (json!({"model": "tiny", "messages": null}), 400, "messages"),
        (json!({"model": "tiny", "messages": []}), 400, "messages"),
        (json!({"model": "tiny", "messages": "hi"}), 400, "messages"),
        (
            json!({"model": "tiny", "messages": [{"role": "user"}]}),
            400,
            "messages",
        ),
        (
            json!({"model": "tiny", "messages": [{"role": "wizard", "content": "x"}]}),
            400,
            "messages",
        ),
        (
            json!({"model": "tiny", "messages": [{"role": "user", "content": 123}]}),
            400,
            "messages",
        ),
        (
            json!({"model": "tiny", "messages": [{"content": "x"}]}),
            400,
            "messages",
        ),
        (
            json!({"model": "tiny", "messages": [{"role": "user", "content": "x".repeat(80)}]}),
            400,
            "messages",
        ),
        (json!({"model": "gpt-9"}), 404, "model"),
        (json!({"model": 7}), 400, "model"),
        (json!({"max_tokens": 0}), 400, "max_tokens"),
        (json!({"max_tokens": -1}), 400, "max_tokens"),
        (json!({"max_tokens": "ten"}), 400, "max_tokens"),
        (json!({"max_tokens": 1e30}), 400, "max_tokens"),
        (
            json!({"max_completion_tokens": -1}),
            400,
            "max_completion_tokens",
        ),
        (json!({"temperature": -0.5}), 400, "temperature"),
        (json!({"temperature": "hot"}), 400, "temperature"),
        (json!({"top_p": 0}), 400, "top_p"),
        (json!({"top_p": 1.5}), 400, "top_p"),
        (json!({"top_k": -5}), 400, "top_k"),
        (json!({"n": 17}), 400, "n"),
        (json!({"n": 0}), 400, "n"),
        (json!({"tier": "gold"}), 400, "tier"),
        (json!({"stream": "yes"}), 400, "stream"),
        (json!({"stop": 5}), 400, "stop"),
        (json!({"stop": [1, 2]}), 400, "stop"),
        (json!({"seed": "abc"}), 400, "seed"),
        (json!({"priority": "high"}), 400, "priority"),
        (json!({"priority": 3_000_000_000_i64}), 400, "priority"),
        (json!({"logprobs": 1}), 400, "logprobs"),
        (json!({"top_logprobs": 3}), 400, "top_logprobs"),
        (
            json!({"logprobs": true, "top_logprobs": 21}),
            400,
            "top_logprobs",
        ),
        (
            // NOTE: a tool without a function (tools themselves are served: a template that
            // cannot render them gets them in the system prompt).
            json!({"tools": [{"type": "function"}]}),
            400,
            "tools",
        ),
        (json!({"tool_choice": "required"}), 400, "tool_choice"),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"schema": [1]}}}),
            400,
            "response_format",
        ),
        // Structured output the worker could not serve (issue 29 item 6): refused before
        // queueing, naming the field.
        (
            json!({"response_format": {"type": "json_schema", "json_schema":
                {"name": "x", "schema": {"type": "string", "pattern": "^(a{1000}){1000}$"}}}}),
            400,
            "response_format",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema":
                {"name": "x", "schema": {"$ref": "#"}}}}),
            400,
            "response_format",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x",
                "schema": {"$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}},
                           "$ref": "#/$defs/A"}}}}),
            400,
            "response_format",
        ),
        (
            json!({"stop_token_ids": [999_999_999]}),
            400,
            "stop_token_ids",
        ),
        (json!({"logit_bias": {"1": 500}}), 400, "logit_bias"),
        (json!({"logit_bias": {"x": 5}}), 400, "logit_bias"),
        (json!({"logit_bias": [1]}), 400, "logit_bias"),
        (json!({"presence_penalty": 2.5}), 400, "presence_penalty"),
        (json!({"frequency_penalty": -2.5}), 400, "frequency_penalty"),
        (json!({"repetition_penalty": 0}), 400, "repetition_penalty"),
        (json!({"min_p": 2}), 400, "min_p"),
        (json!({"min_tokens": -1}), 400, "min_tokens"),
        (
            json!({"stream_options": {"include_usage": "no"}}),
            400,
            "stream_options",
        ),
    ];
    for (extra, status, param) in chat_cases {
        v.push(("POST", c, JSON, chat(extra), status, json!(param)));
    }
    let completion_cases: Vec<(Value, u16, &str)> = vec![
        (json!({"model": "tiny", "prompt": null}), 400, "prompt"),
        (json!({"model": "tiny", "prompt": []}), 400, "prompt"),
        (
            json!({"model": "tiny", "prompt": [1, 99999]}),
            400,
            "prompt",
        ),
        (
            json!({"model": "tiny", "prompt": [[1, 2], [99999]]}),
            400,
            "prompt",
        ),
        (json!({"model": "tiny", "prompt": 123}), 400, "prompt"),
        (
            json!({"model": "tiny", "prompt": "y".repeat(64)}),
            400,
            "prompt",
        ),
        (json!({"best_of": 2}), 400, "best_of"),
        (json!({"suffix": "x"}), 400, "suffix"),
        (json!({"max_tokens": 0}), 400, "max_tokens"),
        (json!({"logprobs": 21}), 400, "logprobs"),
        (json!({"logprobs": true}), 400, "logprobs"),
        (json!({"top_logprobs": 2}), 400, "top_logprobs"),
        (json!({"temperature": -1}), 400, "temperature"),
        (json!({"stop_token_ids": [1, 4096]}), 400, "stop_token_ids"),
    ];
    for (extra, status, param) in completion_cases {
        v.push(("POST", p, JSON, completion(extra), status, json!(param)));
    }
    let generate_cases: Vec<(String, u16, &str)> = vec![
        (json!({"sampling_params": {}}).to_string(), 400, "input_ids"),
        (json!({"input_ids": []}).to_string(), 400, "input_ids"),
        (json!({"input_ids": ["a"]}).to_string(), 400, "input_ids"),
        (json!({"input_ids": [-1]}).to_string(), 400, "input_ids"),
        (
            json!({"input_ids": [1, 99999]}).to_string(),
            400,
            "input_ids",
        ),
        (
            // 0 answers the prompt alone, as SGLang does (e2e_drop_in.rs).
            generate(json!({"max_new_tokens": -1})),
            400,
            "max_new_tokens",
        ),
        (generate(json!({"temperature": -1})), 400, "temperature"),
        (generate(json!({"top_p": 2})), 400, "top_p"),
        (
            generate(json!({"presence_penalty": 3})),
            400,
            "presence_penalty",
        ),
        (
            generate(json!({"min_new_tokens": -2})),
            400,
            "min_new_tokens",
        ),
        (
            json!({"input_ids": [104], "sampling_params": "x"}).to_string(),
            400,
            "sampling_params",
        ),
        (
            json!({"input_ids": [104], "text": "hi"}).to_string(),
            400,
            "text",
        ),
        (
            generate(json!({"stop_token_ids": [999_999_999]})),
            400,
            "stop_token_ids",
        ),
        (
            generate(json!({"json_schema": "{\"$ref\": \"#\"}"})),
            400,
            "sampling_params.json_schema",
        ),
    ];
    for (body, status, param) in generate_cases {
        v.push(("POST", g, JSON, body, status, json!(param)));
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_request_gets_a_clear_error_and_the_next_request_still_answers() {
    let r = start(config(), &[MockOptions::default()]).await;
    let normal = json!({"input_ids": [104, 105], "sampling_params": {"max_new_tokens": 3,
                        "ignore_eos": true}});
    let cases = cases();
    assert!(cases.len() >= 60, "{} cases", cases.len());
    let mut wrong = Vec::new();
    for (k, (method, path, ctype, body, status, param)) in cases.iter().enumerate() {
        let resp = call(&r, method, path, &[("Content-Type", ctype)], body).await;
        let got = resp.json();
        let shaped = ["message", "type", "param", "code"]
            .iter()
            .all(|f| got["error"].get(f).is_some());
        // The param names the field, or a part of it (`messages[0].role`).
        let param_ok = param.is_null()
            || got["error"]["param"]
                .as_str()
                .zip(param.as_str())
                .is_some_and(|(g, want)| g.starts_with(want));
        if resp.status != *status || !shaped || !param_ok {
            let shown: String = body.chars().take(80).collect();
            wrong.push(format!(
                "#{k} {method} {path} {shown}: got {} {got}, want {status} param {param}",
                resp.status
            ));
        }
        let after = post(&r, "/generate", normal.clone()).await;
        assert_eq!(after.status, 200, "after #{k}: {}", after.body);
        assert_eq!(
            after.json()["output_ids"],
            json!([104, 105, 104]),
            "after #{k}"
        );
    }
    assert!(
        wrong.is_empty(),
        "{} of {} wrong:\n{}",
        wrong.len(),
        cases.len(),
        wrong.join("\n")
    );
    // Only the normal requests reached the worker.
    let generates = r.mocks[0].stats.generates.load(Ordering::Relaxed);
    assert_eq!(generates, cases.len() as u64);
}
