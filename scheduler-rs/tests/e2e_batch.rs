//! Batched prompts (issue 30 item 4): `/v1/completions` with `prompt: [..]` (texts or id
//! lists), `echo` with `max_tokens: 0`, and `/generate` with `text: [..]`, `input_ids: [[..]]`,
//! `sampling_params.n`, `regex` and `ebnf`. The mock worker echoes each prompt cyclically, so
//! every choice's text names the prompt it answers.

mod common;

use std::collections::BTreeMap;

use common::*;
use nitsum_scheduler::mock_worker::MockOptions;
use serde_json::{json, Value};

fn texts(v: &Value) -> Vec<(u64, String)> {
    v["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["index"].as_u64().unwrap(),
                c["text"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_completions_answer_each_prompt_in_vllms_order_and_sum_usage() {
    let r = start(config(), &[MockOptions::default()]).await;
    // Texts, n = 2: choice index = prompt * n + choice.
    let body = json!({"model": "tiny", "prompt": ["ab", "xyz", "q"], "max_tokens": 4, "n": 2});
    let v = post(&r, "/v1/completions", body).await.json();
    let want: Vec<(u64, String)> = ["abab", "abab", "xyzx", "xyzx", "qqqq", "qqqq"]
        .iter()
        .enumerate()
        .map(|(i, t)| (i as u64, t.to_string()))
        .collect();
    assert_eq!(texts(&v), want);
    // Each prompt counted once, every choice's output.
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": 2 + 3 + 1, "completion_tokens": 24, "total_tokens": 30,
               "prompt_tokens_details": {"cached_tokens": 0}})
    );
    // Each choice equals the same prompt sent alone.
    for (i, p) in ["ab", "xyz", "q"].iter().enumerate() {
        let one = post(
            &r,
            "/v1/completions",
            json!({"model": "tiny", "prompt": p, "max_tokens": 4}),
        )
        .await
        .json();
        assert_eq!(one["choices"][0]["text"], v["choices"][2 * i]["text"]);
    }
    // Token-id lists, with echo: each choice starts with its own prompt.
    let body = json!({"model": "tiny", "prompt": [[104, 105], [120]], "max_tokens": 2,
                      "echo": true});
    let v = post(&r, "/v1/completions", body).await.json();
    assert_eq!(texts(&v), [(0, "hihi".into()), (1, "xxx".into())]);
    // Streamed: every chunk carries its choice's index; the texts add up to the whole ones.
    let body = json!({"model": "tiny", "prompt": ["ab", "xyz"], "max_tokens": 3, "n": 2,
                      "stream": true, "stream_options": {"include_usage": true}});
    let chunks = post(&r, "/v1/completions", body).await.sse_chunks();
    let mut by_index: BTreeMap<u64, String> = BTreeMap::new();
    let mut finished = 0;
    for c in &chunks {
        for ch in c["choices"].as_array().unwrap() {
            let i = ch["index"].as_u64().unwrap();
            by_index
                .entry(i)
                .or_default()
                .push_str(ch["text"].as_str().unwrap());
            finished += usize::from(!ch["finish_reason"].is_null());
        }
    }
    let want: BTreeMap<u64, String> = [(0, "aba"), (1, "aba"), (2, "xyz"), (3, "xyz")]
        .into_iter()
        .map(|(i, t)| (i, t.to_string()))
        .collect();
    assert_eq!(by_index, want);
    assert_eq!(finished, 4);
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(usage["prompt_tokens"], 5);
    assert_eq!(usage["completion_tokens"], 12);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_batch_element_or_too_many_prompts_is_a_400_naming_prompt() {
    let mut cfg = config();
    cfg.max_batch_prompts = 3;
    let r = start(cfg, &[MockOptions::default()]).await;
    let cases = [
        (json!([[104, 105], [99999]]), "prompt 1: token id 99999"),
        (json!(["ok", "y".repeat(64)]), "prompt 1: "),
        (json!([[104], []]), "prompt 1: the prompt is empty"),
        (json!(["a", "b", "c", "d"]), "4 prompts in one request"),
        (json!([[1], [2], [3], [4]]), "at most 3 (max_batch_prompts)"),
        (json!([]), "the prompt is empty"),
    ];
    for (prompt, says) in cases {
        let resp = post(
            &r,
            "/v1/completions",
            json!({"model": "tiny", "prompt": prompt, "max_tokens": 2}),
        )
        .await;
        assert_eq!(err(&resp), (400, json!("prompt")), "{prompt}");
        let msg = resp.json()["error"]["message"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(msg.contains(says), "{prompt}: {msg}");
    }
    // A sampling error is the same for every prompt: it names its field, no prompt.
    for prompt in [json!("hi"), json!(["hi", "yo"])] {
        let body = json!({"model": "tiny", "prompt": prompt, "temperature": -1});
        let resp = post(&r, "/v1/completions", body).await;
        assert_eq!(err(&resp), (400, json!("temperature")));
        let msg = resp.json()["error"]["message"]
            .as_str()
            .unwrap()
            .to_string();
        assert_eq!(msg, "temperature must be >= 0");
    }
    // Nothing of a refused batch was submitted: the router holds no request.
    let load = call(&r, "GET", "/load", &[], "").await.json();
    assert_eq!(load, json!({"server_load": 0}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_with_max_tokens_0_answers_the_prompt_alone() {
    let r = start(config(), &[MockOptions::default()]).await;
    let body = json!({"model": "tiny", "prompt": ["hello", "xy"], "max_tokens": 0,
                      "echo": true});
    let v = post(&r, "/v1/completions", body).await.json();
    assert!(v["choices"].is_array(), "{v}");
    assert_eq!(texts(&v), [(0, "hello".into()), (1, "xy".into())]);
    for c in v["choices"].as_array().unwrap() {
        assert_eq!(c["finish_reason"], "length");
    }
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": 6, "completion_tokens": 0, "total_tokens": 6,
               "prompt_tokens_details": {"cached_tokens": 0}})
    );
    // Streamed: one chunk per prompt, the prompt and the finish.
    let body = json!({"model": "tiny", "prompt": "hello", "max_tokens": 0, "echo": true,
                      "stream": true});
    let chunks = post(&r, "/v1/completions", body).await.sse_chunks();
    let texts: Vec<&str> = chunks
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(texts.concat(), "hello");
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );
    // Without echo, max_tokens 0 asks for nothing: still a 400.
    let resp = post(
        &r,
        "/v1/completions",
        json!({"model": "tiny", "prompt": "hi", "max_tokens": 0}),
    )
    .await;
    assert_eq!(err(&resp), (400, json!("max_tokens")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generate_answers_a_batch_or_n_with_a_list_in_sglangs_order() {
    let r = start(config(), &[MockOptions::default()]).await;
    let sp = json!({"max_new_tokens": 3});
    let list = |v: Value| -> Vec<String> {
        v.as_array()
            .unwrap_or_else(|| panic!("not a list: {v}"))
            .iter()
            .map(|x| x["text"].as_str().unwrap().to_string())
            .collect()
    };
    let v = post(
        &r,
        "/generate",
        json!({"text": ["ab", "xyz"], "sampling_params": sp}),
    )
    .await
    .json();
    assert_eq!(list(v), ["aba", "xyz"]);
    let v = post(
        &r,
        "/generate",
        json!({"input_ids": [[104, 105], [120]], "sampling_params": sp}),
    )
    .await
    .json();
    assert_eq!(list(v.clone()), ["hih", "xxx"]);
    assert_eq!(v[1]["output_ids"], json!([120, 120, 120]));
    assert_eq!(v[0]["meta_info"]["prompt_tokens"], 2);
    // n > 1: one prompt, a list of n; with a batch, prompt-major.
    let n2 = json!({"max_new_tokens": 2, "n": 2});
    let v = post(
        &r,
        "/generate",
        json!({"text": "ab", "sampling_params": n2}),
    )
    .await
    .json();
    assert_eq!(list(v), ["ab", "ab"]);
    let v = post(
        &r,
        "/generate",
        json!({"text": ["ab", "q"], "sampling_params": n2}),
    )
    .await
    .json();
    assert_eq!(list(v), ["ab", "ab", "qq", "qq"]);
    // One prompt in a one-element list is still a list (SGLang's batch of one).
    let v = post(
        &r,
        "/generate",
        json!({"text": ["ab"], "sampling_params": sp}),
    )
    .await
    .json();
    assert_eq!(list(v), ["aba"]);
    // A single prompt stays one object.
    let v = post(
        &r,
        "/generate",
        json!({"text": "ab", "sampling_params": sp}),
    )
    .await
    .json();
    assert_eq!(v["text"], "aba");
    // Streamed: cumulative per choice, told apart by `index`.
    let body = json!({"text": ["ab", "xyz"], "sampling_params": sp, "stream": true});
    let chunks = post(&r, "/generate", body).await.sse_chunks();
    let mut last: BTreeMap<u64, String> = BTreeMap::new();
    for c in &chunks {
        let i = c["index"]
            .as_u64()
            .unwrap_or_else(|| panic!("no index: {c}"));
        last.insert(i, c["text"].as_str().unwrap().to_string());
    }
    assert_eq!(last.into_values().collect::<Vec<_>>(), ["aba", "xyz"]);
    // Errors name their field; nothing is submitted.
    for (body, param) in [
        (json!({"text": [], "sampling_params": sp}), "text"),
        (
            json!({"input_ids": [[104], [99999]], "sampling_params": sp}),
            "input_ids",
        ),
        (
            json!({"text": "a", "sampling_params": {"n": 0}}),
            "sampling_params.n",
        ),
        (
            json!({"text": "a", "sampling_params": {"n": 17}}),
            "sampling_params.n",
        ),
        (
            json!({"text": "a", "sampling_params": {"regex": "[0-9"}}),
            "sampling_params.regex",
        ),
        (
            json!({"text": "a", "sampling_params": {"regex": "a", "ebnf": "root ::= \"a\""}}),
            "sampling_params.regex",
        ),
        (
            json!({"text": "a", "sampling_params": {"ebnf": " "}}),
            "sampling_params.ebnf",
        ),
    ] {
        let resp = post(&r, "/generate", body.clone()).await;
        assert_eq!(err(&resp), (400, json!(param)), "{body}: {}", resp.body);
    }
    // A valid regex or EBNF grammar is accepted (the worker constrains with it).
    for sp in [
        json!({"max_new_tokens": 2, "regex": "[a-z]+"}),
        json!({"max_new_tokens": 2, "ebnf": "root ::= \"ab\""}),
    ] {
        let resp = post(
            &r,
            "/generate",
            json!({"text": "ab", "sampling_params": sp}),
        )
        .await;
        assert_eq!(resp.status, 200, "{}", resp.body);
    }
}
