//! vLLM's request fields through HTTP → router → mock worker (which echoes the prompt):
//! the text they shape, the reply fields they add, and the 400s naming what cannot be served.

mod common;

use common::*;
use nitsum_scheduler::mock_worker::MockOptions;
use nitsum_scheduler::testutil::{EOS_ID, IM_START_ID};
use serde_json::{json, Value};

fn completion(prompt: Value, extra: Value) -> Value {
    let mut body = json!({"model": "tiny", "prompt": prompt});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn special_tokens_and_stop_strings_in_the_text_as_asked() {
    let r = start(config(), &[MockOptions::default()]).await;
    let text = |v: Value| v["choices"][0]["text"].as_str().unwrap().to_string();
    // The echo: <|im_start|> h i <|im_end|>, ending on EOS.
    let ids = json!([IM_START_ID, 104, 105, EOS_ID]);
    let run = |extra: Value| post(&r, "/v1/completions", completion(ids.clone(), extra));
    assert_eq!(text(run(json!({"max_tokens": 6})).await.json()), "hi");
    let shown = run(json!({"max_tokens": 6, "skip_special_tokens": false}))
        .await
        .json();
    // The EOS that ends the request is not text (vLLM's rule) unless the stop is kept.
    assert_eq!(text(shown), "<|im_start|>hi");
    let kept = json!({"skip_special_tokens": false, "include_stop_str_in_output": true});
    assert_eq!(text(run(kept).await.json()), "<|im_start|>hi<|im_end|>");
    // A stop string: cut before it, or kept.
    let run = |extra: Value| post(&r, "/v1/completions", completion(json!("abcdef"), extra));
    let v = run(json!({"stop": ["cd"], "max_tokens": 6})).await.json();
    assert_eq!(
        (text(v.clone()), &v["choices"][0]["finish_reason"]),
        ("ab".into(), &json!("stop"))
    );
    let v = run(json!({"stop": ["cd"], "include_stop_str_in_output": true, "max_tokens": 6}))
        .await
        .json();
    assert_eq!(text(v), "abcd");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reply_fields_ids_truncation_and_usage() {
    let r = start(config(), &[MockOptions::default()]).await;
    let body = completion(
        json!("abcdef"),
        json!({"max_tokens": 3, "request_id": "job-1", "return_token_ids": true}),
    );
    let v = post(&r, "/v1/completions", body).await.json();
    assert_eq!(v["id"], "cmpl-job-1");
    assert_eq!(v["prompt_token_ids"], json!([97, 98, 99, 100, 101, 102]));
    assert_eq!(v["choices"][0]["token_ids"], json!([97, 98, 99]));
    assert_eq!(
        v["usage"]["prompt_tokens_details"],
        json!({"cached_tokens": 0})
    );
    // Only the last 2 prompt tokens are served (and echoed by the mock).
    let body = completion(
        json!("abcdef"),
        json!({"max_tokens": 3, "truncate_prompt_tokens": 2, "return_token_ids": true}),
    );
    let v = post(&r, "/v1/completions", body).await.json();
    assert_eq!(v["prompt_token_ids"], json!([101, 102]));
    assert_eq!(
        (
            v["usage"]["prompt_tokens"].clone(),
            v["choices"][0]["text"].clone()
        ),
        (json!(2), json!("efe"))
    );
    // A chat response id from the caller's request id.
    let chat = json!({"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                      "max_tokens": 2, "request_id": "c-9", "verbosity": "low",
                      "safety_identifier": "u", "prompt_cache_key": "k"});
    let v = post(&r, "/v1/chat/completions", chat).await;
    assert_eq!(v.status, 200, "{}", v.body);
    assert_eq!(v.json()["id"], "chatcmpl-c-9");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn continuous_usage_rides_on_every_chunk_with_its_token_ids() {
    let one = MockOptions {
        tokens_per_message: 1,
        ..MockOptions::default()
    };
    let r = start(config(), &[one]).await;
    let body = completion(
        json!("abcd"),
        json!({"max_tokens": 4, "stream": true, "return_token_ids": true,
               "stream_options": {"include_usage": true, "continuous_usage_stats": true}}),
    );
    let chunks = post(&r, "/v1/completions", body).await.sse_chunks();
    let with_choices: Vec<&Value> = chunks
        .iter()
        .filter(|c| c["choices"].as_array().is_some_and(|a| !a.is_empty()))
        .collect();
    let counts: Vec<u64> = with_choices
        .iter()
        .map(|c| c["usage"]["completion_tokens"].as_u64().unwrap())
        .collect();
    assert_eq!(counts, [1, 2, 3, 4]);
    let ids: Vec<u64> = with_choices
        .iter()
        .flat_map(|c| c["choices"][0]["token_ids"].as_array().unwrap().clone())
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(ids, [97, 98, 99, 100]);
    assert_eq!(chunks.last().unwrap()["usage"]["completion_tokens"], 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_cannot_be_served_is_a_400_naming_the_field() {
    let r = start(config(), &[MockOptions::default()]).await;
    let chat = |extra: Value| {
        let mut b = json!({"model": "tiny", "messages": [{"role": "user", "content": "x"}]});
        b.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        b
    };
    let cases = [
        (
            "/v1/chat/completions",
            chat(json!({"guided_choice": ["a"], "guided_regex": "b"})),
            "guided_regex",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"guided_json": {"type": "object"},
                        "response_format": {"type": "json_object"}})),
            "guided_json",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"structured_outputs": {"structural_tag": "{}"}})),
            "structured_outputs.structural_tag",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"stream": true, "stream_options": {"include_usage": true, "foo": 1}})),
            "stream_options.foo",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"verbosity": "max"})),
            "verbosity",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"allowed_token_ids": [100000]})),
            "allowed_token_ids",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"prompt_logprobs": 21})),
            "prompt_logprobs",
        ),
        (
            "/v1/completions",
            completion(json!("hi"), json!({"return_tokens_as_token_ids": true})),
            "return_tokens_as_token_ids",
        ),
        (
            "/v1/completions",
            completion(json!("hi"), json!({"truncate_prompt_tokens": -2})),
            "truncate_prompt_tokens",
        ),
        (
            "/v1/completions",
            completion(json!("hi"), json!({"cache_salt": ""})),
            "cache_salt",
        ),
    ];
    for (path, body, param) in cases {
        let resp = post(&r, path, body.clone()).await;
        assert_eq!(err(&resp), (400, json!(param)), "{path} {body}");
    }
}
