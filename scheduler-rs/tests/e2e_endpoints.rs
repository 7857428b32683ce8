//! Endpoints scripts use beside generation (issue 18): `/tokenize`, `/detokenize`,
//! `/version`, `/v1/models/{id}`, and the native `/generate` stream in SGLang's cumulative
//! format.

mod common;

use common::*;
use nitsum_scheduler::mock_worker::MockOptions;
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_agrees_with_what_generation_counts_and_detokenize_inverts_it() {
    let r = start(config(), &[MockOptions::default()]).await;
    // A completion prompt: the count is what usage reports for the same prompt.
    let t = post(&r, "/tokenize", json!({"model": "tiny", "prompt": "héllo"})).await;
    assert_eq!(t.status, 200, "{}", t.body);
    let t = t.json();
    let done = post(
        &r,
        "/v1/completions",
        json!({"model": "tiny", "prompt": "héllo", "max_tokens": 1}),
    )
    .await
    .json();
    assert_eq!(t["count"], done["usage"]["prompt_tokens"]);
    // Byte-level with one merge ("l"+"l"): h, é (two bytes), ll, o.
    assert_eq!(t["tokens"].as_array().unwrap().len(), 5);
    assert_eq!(t["max_model_len"], 64);
    // Chat messages: rendered with the template, counted as a chat completion counts them.
    let messages = json!([{"role": "user", "content": "hi"}]);
    let t = post(&r, "/tokenize", json!({"messages": messages}))
        .await
        .json();
    let done = post(
        &r,
        "/v1/chat/completions",
        json!({"model": "tiny", "messages": messages, "max_tokens": 1}),
    )
    .await
    .json();
    assert_eq!(t["count"], done["usage"]["prompt_tokens"]);
    assert!(
        t["count"].as_u64().unwrap() > 2,
        "the template adds its markers"
    );
    // Round trip.
    let ids = post(&r, "/tokenize", json!({"prompt": "ab😀"}))
        .await
        .json()["tokens"]
        .clone();
    let back = post(&r, "/detokenize", json!({"tokens": ids})).await.json();
    assert_eq!(back["prompt"], "ab😀");
    assert_eq!(back["text"], "ab😀");
    // Errors name their field.
    for (path, body, status, param) in [
        ("/tokenize", json!({}), 400, "prompt"),
        (
            "/tokenize",
            json!({"prompt": "x", "model": "gpt-9"}),
            404,
            "model",
        ),
        (
            "/tokenize",
            json!({"prompt": "x", "bogus": 1}),
            400,
            "bogus",
        ),
        ("/detokenize", json!({"tokens": [1, 999999]}), 400, "tokens"),
        ("/detokenize", json!({}), 400, "tokens"),
    ] {
        let resp = post(&r, path, body.clone()).await;
        assert_eq!(err(&resp), (status, json!(param)), "{path} {body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_and_one_model_by_id() {
    let r = start(config(), &[MockOptions::default()]).await;
    let v = call(&r, "GET", "/version", &[], "").await.json();
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
    let m = call(&r, "GET", "/v1/models/tiny", &[], "").await;
    assert_eq!(m.status, 200);
    let m = m.json();
    assert_eq!(
        (m["id"].clone(), m["object"].clone()),
        (json!("tiny"), json!("model"))
    );
    assert_eq!(m["max_model_len"], 64);
    let missing = call(&r, "GET", "/v1/models/gpt-9", &[], "").await;
    assert_eq!(err(&missing), (404, json!("model")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_stream_chunks_are_cumulative_like_sglang() {
    let one_token_a_message = MockOptions {
        tokens_per_message: 1,
        ..MockOptions::default()
    };
    let r = start(config(), &[one_token_a_message]).await;
    let body = json!({"text": "abcd", "sampling_params": {"max_new_tokens": 6}});
    let whole = post(&r, "/generate", body.clone()).await.json();
    let mut stream_body = body;
    stream_body["stream"] = json!(true);
    let resp = post(&r, "/generate", stream_body).await;
    let chunks = resp.sse_chunks();
    assert!(chunks.len() >= 6, "one chunk per token: {chunks:?}");
    // Each chunk holds everything so far: SGLang's clients keep the last chunk's text.
    for pair in chunks.windows(2) {
        let (a, b) = (
            pair[0]["text"].as_str().unwrap(),
            pair[1]["text"].as_str().unwrap(),
        );
        assert!(b.starts_with(a), "{a:?} then {b:?}");
        let (a, b) = (
            pair[0]["output_ids"].as_array().unwrap(),
            pair[1]["output_ids"].as_array().unwrap(),
        );
        assert!(b.len() >= a.len() && b[..a.len()] == a[..]);
    }
    let last = chunks.last().unwrap();
    assert_eq!(last["text"], whole["text"]);
    assert_eq!(last["output_ids"], whole["output_ids"]);
    assert_eq!(last["meta_info"]["completion_tokens"], 6);
    assert_eq!(last["meta_info"]["finish_reason"]["type"], "length");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_and_sglang_utility_endpoints_answer_in_their_shapes() {
    let r = start(config(), &[MockOptions::default()]).await;
    // vLLM's /ping (GET and POST) and /load.
    for method in ["GET", "POST"] {
        let resp = call(&r, method, "/ping", &[], "").await;
        assert_eq!(resp.status, 200, "{method} /ping: {}", resp.body);
    }
    let load = call(&r, "GET", "/load", &[], "").await.json();
    assert_eq!(load, json!({"server_load": 0}));
    // SGLang's /get_model_info, as `sgl.RuntimeEndpoint` reads it when it connects.
    let info = call(&r, "GET", "/get_model_info", &[], "").await.json();
    assert_eq!(info["model_path"], "tiny");
    assert_eq!(info["is_generation"], true);
    assert_eq!(info["served_model_name"], "tiny");
    assert_eq!(info["max_model_len"], 64);
    for path in ["/server_info", "/get_server_info"] {
        let s = call(&r, "GET", path, &[], "").await.json();
        assert_eq!(s["served_model_name"], "tiny", "{path}");
        assert_eq!(s["context_length"], 64);
        assert_eq!(s["max_batch_prompts"], 256);
        assert_eq!(s["internal_states"][0]["workers"], 1);
        assert_eq!(s["version"], env!("CARGO_PKG_VERSION"));
    }
    // /health_generate runs a one-token generation through the worker.
    for method in ["GET", "POST"] {
        let resp = call(&r, method, "/health_generate", &[], "").await;
        assert_eq!(resp.status, 200, "{method}: {}", resp.body);
    }
    // /v1/models: vLLM's root (the model's source) and parent (an adapter's base: none).
    let models = call(&r, "GET", "/v1/models", &[], "").await.json();
    assert_eq!(models["data"][0]["root"], "tiny");
    assert_eq!(models["data"][0]["parent"], Value::Null);
    // /tokenize's return_token_strs: the tokenizer's own strings (byte-level: "Ġ" is a space).
    let t = post(
        &r,
        "/tokenize",
        json!({"prompt": "hi all", "return_token_strs": true}),
    )
    .await
    .json();
    assert_eq!(t["token_strs"], json!(["h", "i", "Ġ", "a", "ll"]));
    assert_eq!(t["count"], 5);
    let t = post(&r, "/tokenize", json!({"prompt": "hi"})).await.json();
    assert_eq!(t["token_strs"], Value::Null);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_generate_and_ping_say_503_without_a_worker() {
    let r = start(config(), &[]).await;
    let resp = call(&r, "GET", "/health_generate", &[], "").await;
    assert_eq!(err(&resp).0, 503, "{}", resp.body);
    assert!(resp.body.contains("no worker"), "{}", resp.body);
    assert_eq!(call(&r, "GET", "/ping", &[], "").await.status, 503);
}
