//! HTTP → router → mock worker (real ZeroMQ protocol) → HTTP.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use nitsum_scheduler::config::ApiKey;
use nitsum_scheduler::ids::WorkerId;
use nitsum_scheduler::mock_worker::MockOptions;
use nitsum_scheduler::testutil::{EOS_ID, IM_START_ID};
use serde_json::{json, Value};

fn streaming() -> MockOptions {
    MockOptions {
        tokens_per_message: 1,
        ..MockOptions::default()
    }
}

fn chat(content: &str, extra: Value) -> Value {
    let mut body = json!({"model": "tiny", "messages": [{"role": "user", "content": content}]});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_non_stream_echoes_and_stops_on_eos() {
    let r = start(config(), &[MockOptions::default(), MockOptions::default()]).await;
    // The mock echoes the prompt: <|im_start|>user\nhé<|im_end|> ... so 5 tokens read "user".
    let resp = post(
        &r,
        "/v1/chat/completions",
        chat("hé", json!({"max_tokens": 5})),
    )
    .await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    let v = resp.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["content"], "user");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let prompt = v["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(prompt > 10);
    assert_eq!(v["usage"]["completion_tokens"], 5);
    assert_eq!(v["usage"]["total_tokens"], prompt + 5);
    // Without a limit the echo reaches <|im_end|> (an EOS id sent in stop_token_ids).
    let v = post(&r, "/v1/chat/completions", chat("hé", json!({})))
        .await
        .json();
    assert_eq!(v["choices"][0]["message"]["content"], "user\nhé");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["completion_tokens"], 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_stream_splits_multibyte_safely_and_ends_with_done() {
    let r = start(config(), &[streaming()]).await;
    let body = chat(
        "é😀",
        json!({"stream": true, "stream_options": {"include_usage": true}}),
    );
    let resp = post(&r, "/v1/chat/completions", body).await;
    assert_eq!(resp.status, 200);
    assert!(resp.headers.contains("text/event-stream"));
    let chunks = resp.sse_chunks();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let deltas: Vec<&str> = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0)?["delta"]["content"].as_str())
        .collect();
    // One token per message: é is 2 tokens and 😀 is 4, yet every delta is whole text.
    assert!(deltas.iter().all(|d| !d.contains('\u{FFFD}')));
    assert!(deltas.contains(&"😀"));
    assert_eq!(deltas.concat(), "user\né😀");
    let finish: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0))
        .map(|c| &c["finish_reason"])
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finish, [&json!("stop")]);
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(usage["completion_tokens"], 13);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_stop_string_truncates_and_aborts_worker() {
    // Slow enough that the stop string is always seen before the worker finishes.
    let slow = paced(20);
    let r = start(config(), &[slow]).await;
    // Prompt ids are echoed: "abcabc..." — stop at "ca" across token boundaries.
    let body = json!({"model": "tiny", "prompt": "abcabcabc", "max_tokens": 30, "stop": ["ca"], "stream": true});
    let resp = post(&r, "/v1/completions", body).await;
    let chunks = resp.sse_chunks();
    let text: String = chunks
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, "ab");
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "stop"
    );
    wait_until(|| r.mocks[0].stats.aborts.load(Ordering::Relaxed) == 1).await;
    assert_eq!(r.run.router.inflight(), 0);

    // Non-stream, token-id prompt, list stop, echo.
    let body = json!({"model": "tiny", "prompt": [104, 105, 33], "max_tokens": 7, "stop": "!h", "echo": true});
    let v = post(&r, "/v1/completions", body).await.json();
    assert_eq!(v["choices"][0]["text"], "hi!hi");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["prompt_tokens"], 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_generate_and_info_endpoints() {
    let r = start(config(), &[MockOptions::default(), MockOptions::default()]).await;
    let body =
        json!({"input_ids": [IM_START_ID, 104, 105], "sampling_params": {"max_new_tokens": 4}});
    let v = post(&r, "/generate", body).await.json();
    assert_eq!(v["output_ids"], json!([IM_START_ID, 104, 105, IM_START_ID]));
    assert_eq!(v["text"], "hi");
    assert_eq!(v["meta_info"]["finish_reason"]["type"], "length");
    assert_eq!(v["meta_info"]["completion_tokens"], 4);
    assert_eq!(v["meta_info"]["class"], "feasible");
    let v = post(
        &r,
        "/generate",
        json!({"text": "ab", "sampling_params": {"max_new_tokens": 3}}),
    )
    .await
    .json();
    assert_eq!(v["text"], "aba");

    let models = call(&r, "GET", "/v1/models", &[], "").await.json();
    assert_eq!(models["data"][0]["id"], "tiny");
    assert_eq!(call(&r, "GET", "/health", &[], "").await.status, 200);
    let plan = call(&r, "GET", "/admin/plan", &[], "").await.json();
    assert_eq!(plan["groups"].as_array().unwrap().len(), 2);
    assert_eq!(plan["groups"][0]["tp"], 1);
    assert_eq!(plan["groups"][0]["tiers"], json!(["strict", "relaxed"]));
    let metrics = call(&r, "GET", "/metrics", &[], "").await.body;
    for name in [
        "nitsum_ttft_seconds_bucket{tier=\"strict\",le=\"+Inf\"} 2",
        "nitsum_requests_finished_total{tier=\"strict\"} 2",
        "nitsum_requests_dispatched_total{tier=\"strict\",class=\"feasible\"} 2",
        "nitsum_group_tp{group=\"0\",role=\"mixed\"} 1",
        "nitsum_plan_epoch ",
        "nitsum_slo_attainment{tier=\"strict\"}",
        "nitsum_e2e_seconds_count{tier=\"relaxed\"} 0",
    ] {
        assert!(metrics.contains(name), "missing {name} in\n{metrics}");
    }
    // Both mocks got a reconfigure with the whole plan.
    assert!(r
        .mocks
        .iter()
        .all(|m| m.stats.reconfigures.load(Ordering::Relaxed) >= 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_openai_errors() {
    let r = start(config(), &[MockOptions::default()]).await;
    let bad_json = call(&r, "POST", "/v1/chat/completions", &[], "{not json").await;
    assert_eq!(err(&bad_json).0, 400);
    let cases = [
        (
            "/v1/chat/completions",
            json!({"model": "tiny"}),
            400,
            json!("messages"),
        ),
        (
            "/v1/chat/completions",
            chat("x", json!({"model": "gpt-9"})),
            404,
            json!("model"),
        ),
        (
            "/v1/chat/completions",
            chat("x", json!({"max_tokens": 0})),
            400,
            json!("max_tokens"),
        ),
        (
            "/v1/chat/completions",
            chat("x", json!({"max_completion_tokens": -1})),
            400,
            json!("max_completion_tokens"),
        ),
        (
            "/v1/chat/completions",
            chat("x", json!({"temperature": -0.5})),
            400,
            json!("temperature"),
        ),
        (
            "/v1/chat/completions",
            chat("x", json!({"top_p": 0})),
            400,
            json!("top_p"),
        ),
        (
            "/v1/chat/completions",
            chat("x", json!({"n": 17})),
            400,
            json!("n"),
        ),
        (
            "/v1/chat/completions",
            chat("x", json!({"n": 0})),
            400,
            json!("n"),
        ),
        (
            "/v1/chat/completions",
            chat("x", json!({"tier": "gold"})),
            400,
            json!("tier"),
        ),
        (
            "/v1/chat/completions",
            chat(&"x".repeat(80), json!({})),
            400,
            json!("messages"),
        ),
        (
            "/v1/completions",
            json!({"model": "tiny", "prompt": "y".repeat(64)}),
            400,
            json!("prompt"),
        ),
        (
            "/v1/completions",
            json!({"model": "tiny", "prompt": [1, 99999]}),
            400,
            json!("prompt"),
        ),
        (
            "/v1/completions",
            json!({"model": "tiny", "max_tokens": 3}),
            400,
            json!("prompt"),
        ),
        // Nothing silently ignored: a misspelt field, an extension asking for what is not
        // built. (A missing model is the served one, as in vLLM: e2e_drop_in.rs.)
        (
            "/v1/chat/completions",
            chat("x", json!({"temprature": 0.5})),
            400,
            json!("temprature"),
        ),
        (
            "/v1/completions",
            json!({"model": "tiny", "prompt": "hi", "use_beam_search": true}),
            400,
            json!("use_beam_search"),
        ),
        (
            "/generate",
            json!({"sampling_params": {}}),
            400,
            json!("input_ids"),
        ),
    ];
    for (path, body, status, param) in cases {
        let resp = post(&r, path, body.clone()).await;
        assert_eq!(err(&resp), (status, param), "{path} {body}");
    }
    // Nothing was dispatched by any of these.
    assert_eq!(r.mocks[0].stats.generates.load(Ordering::Relaxed), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_keys_and_tiers() {
    let mut cfg = config();
    cfg.api_keys = vec![
        ApiKey {
            key: "sk-a".into(),
            tiers: vec!["strict".into(), "relaxed".into()],
            default_tier: Some("relaxed".into()),
            admin: false,
            ..ApiKey::default()
        },
        ApiKey {
            key: "sk-bg".into(),
            tiers: vec!["background".into()],
            default_tier: None,
            admin: false,
            ..ApiKey::default()
        },
        ApiKey {
            key: "sk-ops".into(),
            tiers: vec![],
            default_tier: None,
            admin: true,
            ..ApiKey::default()
        },
    ];
    cfg.restrict_metrics = true;
    let r = start(cfg, &[MockOptions::default()]).await;
    let body = json!({"input_ids": [104], "sampling_params": {"max_new_tokens": 1}}).to_string();
    let no_key = call(&r, "POST", "/generate", &[], &body).await;
    assert_eq!(err(&no_key).0, 401);
    // Admin endpoints and the restricted /metrics: an admin key only.
    for path in ["/admin/plan", "/metrics"] {
        assert_eq!(err(&call(&r, "GET", path, &[], "").await).0, 401, "{path}");
        let user = [("Authorization", "Bearer sk-a")];
        assert_eq!(
            err(&call(&r, "GET", path, &user, "").await).0,
            403,
            "{path}"
        );
        let ops = [("Authorization", "Bearer sk-ops")];
        assert_eq!(call(&r, "GET", path, &ops, "").await.status, 200, "{path}");
    }
    let wrong = call(
        &r,
        "POST",
        "/generate",
        &[("Authorization", "Bearer nope")],
        &body,
    )
    .await;
    assert_eq!(err(&wrong).0, 401);
    let a = call(
        &r,
        "POST",
        "/generate",
        &[("Authorization", "Bearer sk-a")],
        &body,
    )
    .await
    .json();
    assert_eq!(a["meta_info"]["tier"], "relaxed");
    let hdr = [
        ("Authorization", "Bearer sk-a"),
        ("x-nitsum-tier", "strict"),
    ];
    assert_eq!(
        call(&r, "POST", "/generate", &hdr, &body).await.json()["meta_info"]["tier"],
        "strict"
    );
    let forbidden = [
        ("Authorization", "Bearer sk-a"),
        ("x-nitsum-tier", "background"),
    ];
    assert_eq!(
        err(&call(&r, "POST", "/generate", &forbidden, &body).await).0,
        403
    );
    let bg = call(
        &r,
        "POST",
        "/generate",
        &[("Authorization", "Bearer sk-bg")],
        &body,
    )
    .await
    .json();
    assert_eq!(
        (
            bg["meta_info"]["tier"].as_str(),
            bg["meta_info"]["class"].as_str()
        ),
        (Some("background"), Some("background"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_worker_is_503() {
    let r = start(config(), &[]).await;
    let resp = post(
        &r,
        "/v1/completions",
        json!({"model": "tiny", "prompt": "hi"}),
    )
    .await;
    assert_eq!(err(&resp).0, 503);
    assert_eq!(call(&r, "GET", "/health", &[], "").await.status, 503);
    let _ = EOS_ID;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_plan_groups_need_all_members_and_set_decode_target() {
    use nitsum_scheduler::plan::{GroupPlan, Role};
    let mut cfg = config();
    let strict = cfg.tier_index("strict").unwrap();
    let group = |members: &[u32], role| GroupPlan {
        members: members.to_vec(),
        tp: members.len() as u32,
        pp: 1,
        role,
        tiers: vec![strict],
        accepts_background: false,
        max_rps: 0.0,
        max_inflight: 0.0,
    };
    // Workers 0+1 prefill at TP 2 and hand off to worker 2, which decodes.
    cfg.static_plan = Some(vec![
        group(&[0, 1], Role::Prefill),
        group(&[2], Role::Decode),
    ]);
    let r = start(cfg, &[MockOptions::default(), MockOptions::default()]).await;
    // Worker 2 is missing: the decode group is not routable, so the prefill group decodes
    // what it prefills (no decode target) rather than refusing it.
    assert_eq!(r.run.router.plan().groups.len(), 1);
    let body = json!({"input_ids": [104, 105], "sampling_params": {"max_new_tokens": 2}});
    let v = post(&r, "/generate", body.clone()).await.json();
    assert_eq!(v["output_ids"], json!([104, 105]));
    let last = r.mocks[0].stats.last_generate.lock().unwrap().clone();
    assert_eq!(last, Some(("strict".into(), "feasible".into(), None)));
    let late = nitsum_scheduler::mock_worker::spawn(
        &r.run.worker_endpoint,
        WorkerId(2),
        authenticated(&r.run, MockOptions::default()),
    )
    .await
    .unwrap();
    wait_until(|| r.run.router.plan().groups.len() == 2).await;
    let v = post(&r, "/generate", body).await.json();
    assert_eq!(v["output_ids"], json!([104, 105]));
    let last = r.mocks[0].stats.last_generate.lock().unwrap().clone();
    assert_eq!(
        last,
        Some(("strict".into(), "feasible".into(), Some(WorkerId(2))))
    );
    // Background work has no accepting group in this plan.
    let bg = json!({"input_ids": [104], "tier": "background"});
    assert_eq!(post(&r, "/generate", bg).await.status, 503);
    let plan = call(&r, "GET", "/admin/plan", &[], "").await.json();
    assert_eq!(plan["groups"][0]["tp"], 2);
    assert_eq!(plan["groups"][0]["role"], "prefill");
    drop(late);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_tier_answers_429_with_retry_after_and_a_capped_max_tokens_400() {
    let mut cfg = config();
    let strict = cfg.tiers.iter_mut().find(|t| t.name == "strict").unwrap();
    strict.max_inflight = Some(2);
    strict.max_tokens = Some(8);
    let slow = paced(300);
    let r = start(cfg, &[slow]).await;
    let body = json!({"input_ids": [104, 105], "tier": "strict",
                      "sampling_params": {"max_new_tokens": 4, "ignore_eos": true}});
    // Two slow requests fill the tier; the third is refused at once, the others finish.
    let relaxed = json!({"input_ids": [104], "tier": "relaxed",
                         "sampling_params": {"max_new_tokens": 1}});
    let probe = async {
        wait_until(|| r.run.router.inflight() == 2).await;
        let full = post(&r, "/generate", body.clone()).await;
        // Another tier is not affected by strict's bound.
        let other = post(&r, "/generate", relaxed).await.status;
        (full, other)
    };
    let (a, b, (full, other)) = tokio::join!(
        post(&r, "/generate", body.clone()),
        post(&r, "/generate", body.clone()),
        probe
    );
    assert_eq!(err(&full).0, 429, "{}", full.body);
    assert_eq!(full.json()["error"]["code"], "tier_full");
    assert!(
        full.headers.to_lowercase().contains("retry-after: 1"),
        "{}",
        full.headers
    );
    assert_eq!(other, 200);
    assert_eq!((a.status, b.status), (200, 200));
    assert_eq!(a.json()["output_ids"], json!([104, 105, 104, 105]));
    // Room again once they ended.
    assert_eq!(post(&r, "/generate", body).await.status, 200);
    // The tier's max_tokens cap: above it 400 naming the field; without one, the cap applies.
    let big = json!({"input_ids": [104], "tier": "strict",
                     "sampling_params": {"max_new_tokens": 9}});
    let resp = post(&r, "/generate", big).await;
    assert_eq!(err(&resp).0, 400);
    assert_eq!(resp.json()["error"]["param"], "max_new_tokens");
    let none = json!({"model": "tiny", "prompt": "hi", "tier": "strict"});
    let v = post(&r, "/v1/completions", none).await.json();
    assert!(
        v["usage"]["completion_tokens"].as_u64().unwrap() <= 8,
        "{v}"
    );
}

/// POST a body past the limit and read the answer.
///
/// NOTE: the server answers 413 once it has read the limit and closes with the rest unread, so
/// the kernel resets the connection: the client's remaining writes fail, and a reset that
/// arrives before the client reads can discard the answer. Writes are allowed to fail, and a
/// connection reset before any answer is retried (at most 3 times).
async fn over_the_limit(r: &Router, body: &str) -> Resp {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    for _ in 0..3 {
        let mut s = tokio::net::TcpStream::connect(r.run.http_addr)
            .await
            .unwrap();
        let bytes = request_bytes("POST", "/v1/completions", &[], body);
        let (mut rd, mut wr) = s.split();
        let mut raw = Vec::new();
        let (_, read) = tokio::join!(wr.write_all(&bytes), rd.read_to_end(&mut raw));
        if read.is_ok() || !raw.is_empty() {
            let text = String::from_utf8_lossy(&raw).to_string();
            let (head, body) = text.split_once("\r\n\r\n").expect("header end");
            return Resp {
                status: head[9..12].parse().unwrap(),
                headers: head.to_string(),
                body: body.to_string(),
            };
        }
    }
    panic!("no answer to an over-the-limit body in 3 tries");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_paths_wrong_methods_and_huge_bodies_answer_in_the_openai_error_shape() {
    let r = start(config(), &[MockOptions::default()]).await;
    let nf = call(&r, "GET", "/v1/nope", &[], "").await;
    assert_eq!(err(&nf), (404, Value::Null));
    assert_eq!(nf.json()["error"]["code"], "not_found");
    let wrong = call(&r, "GET", "/v1/completions", &[], "").await;
    assert_eq!(err(&wrong).0, 405);
    assert_eq!(wrong.json()["error"]["code"], "method_not_allowed");
    assert!(
        wrong.headers.to_lowercase().contains("allow: post"),
        "{}",
        wrong.headers
    );
    let huge = json!({"model": "tiny", "prompt": "x".repeat(3 << 20)}).to_string();
    let big = over_the_limit(&r, &huge).await;
    assert_eq!(err(&big).0, 413);
    assert_eq!(big.json()["error"]["code"], "payload_too_large");
    // The server still answers normally afterwards.
    let ok = json!({"input_ids": [104], "sampling_params": {"max_new_tokens": 1}});
    assert_eq!(post(&r, "/generate", ok).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_finishes_what_runs_refuses_what_comes_and_ends_the_rest_explicitly() {
    let slow = paced(200);
    let r = start(config(), &[slow]).await;
    let body = |n: u32| json!({"input_ids": [104, 105], "sampling_params": {"max_new_tokens": n, "ignore_eos": true}});
    // A generous drain: the running request finishes; one sent meanwhile gets 503.
    let during = async {
        wait_until(|| r.run.router.inflight() == 1).await;
        let drained = r.run.drain(Duration::from_secs(10));
        let refused = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            post(&r, "/generate", body(1)).await
        };
        tokio::join!(drained, refused)
    };
    let (done, (ended, refused)) = tokio::join!(post(&r, "/generate", body(3)), during);
    assert_eq!(done.status, 200, "{}", done.body);
    assert_eq!(done.json()["output_ids"], json!([104, 105, 104]));
    assert_eq!(ended, 0);
    assert_eq!(err(&refused).0, 503);
    assert_eq!(refused.json()["error"]["code"], "shutting_down");
    assert_eq!(r.run.router.inflight(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_past_its_deadline_ends_streams_with_an_error_event_and_done() {
    let slow = paced(300);
    let r = start(config(), &[slow]).await;
    let body = json!({"model": "tiny", "prompt": "hi", "stream": true, "max_tokens": 50,
                      "ignore_eos": true});
    let cut = async {
        wait_until(|| r.run.router.inflight() == 1).await;
        tokio::time::sleep(Duration::from_millis(400)).await;
        r.run.drain(Duration::from_millis(100)).await
    };
    let (resp, ended) = tokio::join!(post(&r, "/v1/completions", body), cut);
    assert_eq!(ended, 1);
    assert_eq!(resp.status, 200);
    let data = resp.sse();
    assert_eq!(data.last().unwrap(), "[DONE]", "{data:?}");
    let error: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("shut down"),
        "{error}"
    );
    assert_eq!(r.run.router.inflight(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenizing_huge_prompts_does_not_stall_health() {
    let r = start(config(), &[MockOptions::default()]).await;
    // Four prompts just under the 2 MiB body limit, tokenized at once (their generation
    // fails on the context length afterwards: what matters is the tokenizer's time).
    let text = "héllo wörld ".repeat(120_000);
    let huge = || {
        post(
            &r,
            "/v1/completions",
            json!({"model": "tiny", "prompt": text}),
        )
    };
    let probe = async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let mut worst = Duration::ZERO;
        for _ in 0..10 {
            let t = std::time::Instant::now();
            assert_eq!(call(&r, "GET", "/health", &[], "").await.status, 200);
            worst = worst.max(t.elapsed());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        worst
    };
    let started = std::time::Instant::now();
    let (a, b, c, d, worst) = tokio::join!(huge(), huge(), huge(), huge(), probe);
    let total = started.elapsed();
    for resp in [a, b, c, d] {
        assert_eq!(
            err(&resp).0,
            400,
            "{}",
            &resp.body[..resp.body.len().min(300)]
        );
    }
    assert!(
        worst < Duration::from_millis(250),
        "/health took {worst:?} while prompts were tokenized ({total:?} in all)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unimplemented_fields_and_bad_sampling_values_are_refused_by_name() {
    let r = start(config(), &[MockOptions::default()]).await;
    let ok = json!({"input_ids": [104, 105], "sampling_params": {"max_new_tokens": 2}});
    let refused = [
        (
            "/v1/completions",
            json!({"model": "tiny", "prompt": "hi", "logprobs": 21}),
            "logprobs",
        ),
        (
            "/v1/completions",
            json!({"model": "tiny", "prompt": "hi", "best_of": 3}),
            "best_of",
        ),
        (
            "/v1/completions",
            json!({"model": "tiny", "prompt": "hi", "suffix": "x"}),
            "suffix",
        ),
        (
            "/v1/chat/completions",
            chat("hi", json!({"logprobs": 2})),
            "logprobs",
        ),
        (
            "/v1/chat/completions",
            chat("hi", json!({"logprobs": true, "top_logprobs": 21})),
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            chat("hi", json!({"top_logprobs": 3})),
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            chat("hi", json!({"tools": [{"type": "function"}]})),
            "tools",
        ),
        (
            "/v1/chat/completions",
            chat("hi", json!({"tool_choice": "required"})),
            "tool_choice",
        ),
        (
            "/v1/chat/completions",
            chat(
                "hi",
                json!({"response_format": {"type": "json_schema", "json_schema": {"schema": [1]}}}),
            ),
            "response_format",
        ),
        (
            "/v1/chat/completions",
            chat("hi", json!({"logit_bias": {"1": 101}})),
            "logit_bias",
        ),
        (
            "/v1/chat/completions",
            chat("hi", json!({"logit_bias": {"999999": 1}})),
            "logit_bias",
        ),
        (
            "/v1/chat/completions",
            chat("hi", json!({"min_p": 1.5})),
            "min_p",
        ),
        (
            "/v1/chat/completions",
            chat("hi", json!({"max_tokens": 4, "min_tokens": 5})),
            "min_tokens",
        ),
        (
            "/v1/chat/completions",
            chat("hi", json!({"repetition_penalty": 0})),
            "repetition_penalty",
        ),
        (
            "/v1/chat/completions",
            chat("hi", json!({"presence_penalty": 2.5})),
            "presence_penalty",
        ),
        (
            "/v1/chat/completions",
            chat("hi", json!({"frequency_penalty": -3})),
            "frequency_penalty",
        ),
        (
            "/v1/chat/completions",
            json!({"model": "tiny", "messages": [{"role": "wizard", "content": "hi"}]}),
            "messages[0].role",
        ),
        (
            "/generate",
            json!({"input_ids": [104], "sampling_params": {"repetition_penalty": -1}}),
            "repetition_penalty",
        ),
        (
            "/generate",
            json!({"input_ids": [104], "sampling_params": {"min_new_tokens": 200}}),
            "min_new_tokens",
        ),
    ];
    for (path, body, field) in refused {
        let resp = post(&r, path, body).await;
        assert_eq!(
            err(&resp),
            (400, json!(field)),
            "{path} {field}: {}",
            resp.body
        );
        // Each bad request leaves the server answering correctly.
        let v = post(&r, "/generate", ok.clone()).await.json();
        assert_eq!(v["output_ids"], json!([104, 105]));
    }
    // In range, they are served (the mock ignores them; tests/test_openai_sampling.py checks
    // their effect on a real worker).
    let asks = chat(
        "hi",
        json!({"max_tokens": 2, "presence_penalty": 0.5, "frequency_penalty": 1,
               "repetition_penalty": 1.2, "logit_bias": {"1": 5}, "min_tokens": 1,
               "min_p": 0.1}),
    );
    assert_eq!(post(&r, "/v1/chat/completions", asks).await.status, 200);
    // What clients send by default is not a request for the feature.
    let neutral = chat(
        "hi",
        json!({"max_tokens": 2, "logprobs": false, "top_logprobs": 0, "tools": [],
               "tool_choice": "none", "response_format": {"type": "text"}, "logit_bias": {},
               "presence_penalty": 0, "frequency_penalty": 0.0, "user": "u-1",
               "skip_special_tokens": true, "service_tier": "auto", "store": false}),
    );
    assert_eq!(post(&r, "/v1/chat/completions", neutral).await.status, 200);
    let neutral = json!({"model": "tiny", "prompt": "hi", "max_tokens": 2, "best_of": 1,
                         "logprobs": null, "suffix": ""});
    assert_eq!(post(&r, "/v1/completions", neutral).await.status, 200);
}

#[tokio::test]
async fn models_report_the_longest_context_a_worker_serves() {
    // The tiny model's window is 64 tokens; a worker whose largest TP group holds 40 caps it.
    let r = start(config(), &[MockOptions::default()]).await;
    let models = call(&r, "GET", "/v1/models", &[], "").await.json();
    assert_eq!(models["data"][0]["max_model_len"], 64);
    let small = MockOptions {
        max_context: 40,
        ..MockOptions::default()
    };
    let r = start(config(), &[small]).await;
    let models = call(&r, "GET", "/v1/models", &[], "").await.json();
    assert_eq!(models["data"][0]["max_model_len"], 40);
    // A prompt beyond it is refused by the router, with the limit.
    let body = json!({"model": "tiny", "prompt": vec![1u32; 45], "max_tokens": 1}).to_string();
    let long = call(&r, "POST", "/v1/completions", &[], &body).await;
    assert_eq!(err(&long).0, 400);
    assert!(
        long.body.contains("maximum context length is 40"),
        "{}",
        long.body
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_choices_go_to_one_worker_as_forks_and_count_the_prompt_once() {
    let r = start(config(), &[MockOptions::default(), MockOptions::default()]).await;
    let body = json!({"model": "tiny", "prompt": "abcd", "max_tokens": 3, "n": 3});
    let resp = post(&r, "/v1/completions", body).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    let v = resp.json();
    let choices = v["choices"].as_array().unwrap();
    let index: Vec<u64> = choices
        .iter()
        .map(|c| c["index"].as_u64().unwrap())
        .collect();
    assert_eq!(index, [0, 1, 2]);
    assert!(choices.iter().all(|c| c["text"] == "abc"), "{v}");
    assert_eq!(v["usage"]["prompt_tokens"], 4);
    assert_eq!(v["usage"]["completion_tokens"], 9);
    assert_eq!(v["usage"]["total_tokens"], 13);
    // Every choice went to the worker of choice 0 (so that it shares its prefill there).
    let sent: Vec<u64> = r
        .mocks
        .iter()
        .map(|m| m.stats.generates.load(Ordering::Relaxed))
        .collect();
    assert!(sent == [3, 0] || sent == [0, 3], "{sent:?}");
    // Streaming: chunks of the three choices, each index ending once.
    let body = json!({"model": "tiny", "prompt": "abcd", "max_tokens": 3, "n": 3,
                      "stream": true, "stream_options": {"include_usage": true}});
    let chunks = post(&r, "/v1/completions", body).await.sse_chunks();
    let mut text = [String::new(), String::new(), String::new()];
    let mut ends = [0, 0, 0];
    for c in chunks.iter().filter_map(|c| c["choices"].get(0)) {
        let i = c["index"].as_u64().unwrap() as usize;
        text[i] += c["text"].as_str().unwrap();
        ends[i] += u32::from(!c["finish_reason"].is_null());
    }
    assert_eq!(text, ["abc", "abc", "abc"]);
    assert_eq!(ends, [1, 1, 1]);
    assert_eq!(chunks.last().unwrap()["usage"]["completion_tokens"], 9);
}

#[tokio::test]
async fn structured_output_combines_with_logprobs_and_n_choices() {
    // The router accepts a grammar with logprobs and n > 1 on both endpoints (the worker's
    // side is tests/test_structured_e2e.py): every choice is sent, to choice 0's worker.
    let r = start(config(), &[MockOptions::default(), MockOptions::default()]).await;
    let schema = json!({"type": "json_schema", "json_schema": {"name": "x", "schema":
                        {"type": "object", "properties": {"a": {"type": "integer"}}}}});
    let bodies = [
        (
            "/v1/chat/completions",
            chat(
                "hi",
                json!({"n": 2, "logprobs": true, "top_logprobs": 2, "response_format": schema}),
            ),
        ),
        (
            "/v1/completions",
            json!({"model": "tiny", "prompt": "abcd", "max_tokens": 3, "n": 2, "logprobs": 1,
                   "response_format": {"type": "json_object"}}),
        ),
    ];
    let sent = || -> Vec<u64> {
        r.mocks
            .iter()
            .map(|m| m.stats.generates.load(Ordering::Relaxed))
            .collect()
    };
    for (path, body) in bodies {
        let before = sent();
        let resp = post(&r, path, body).await;
        assert_eq!(resp.status, 200, "{path}: {}", resp.body);
        let v = resp.json();
        let choices = v["choices"].as_array().unwrap();
        assert_eq!(choices.len(), 2, "{v}");
        assert!(choices.iter().all(|c| !c["logprobs"].is_null()), "{v}");
        let delta: Vec<u64> = sent().iter().zip(&before).map(|(a, b)| a - b).collect();
        assert!(delta == [2, 0] || delta == [0, 2], "{path}: {delta:?}");
    }
}
