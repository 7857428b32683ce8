//! Failure paths end to end: a worker dies (retry, resume from the streamed tokens, or an
//! explicit error once retries are spent) and a client
//! disconnects (abort reaches the worker). architecture §7: one completion or one error each.

mod common;

use std::sync::atomic::Ordering;

use common::*;
use nitsum_scheduler::config::RouterConfig;
use nitsum_scheduler::mock_worker::MockOptions;
use serde_json::{json, Value};
use tokio::io::AsyncReadExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_that_streamed_nothing_is_retried_on_another_worker() {
    // Worker 0 stalls (its first token would come after 30 s); worker 1 answers at once.
    let r = start(config(), &[paced(30_000), MockOptions::default()]).await;
    let pending = tokio::spawn({
        let s = send(
            &r,
            "POST",
            "/generate",
            &[],
            &json!({"input_ids": [104, 105], "sampling_params": {"max_new_tokens": 3}}).to_string(),
        )
        .await;
        read_response(s)
    });
    // Least-loaded tie goes to the first group: worker 0 got it.
    wait_until(|| r.mocks[0].stats.generates.load(Ordering::Relaxed) == 1).await;
    r.mocks[0].kill();
    let resp = pending.await.unwrap();
    assert_eq!(resp.status, 200, "{}", resp.body);
    let v = resp.json();
    assert_eq!(v["text"], "hih");
    assert_eq!(r.mocks[1].stats.generates.load(Ordering::Relaxed), 1);
    let metrics = call(&r, "GET", "/metrics", &[], "").await.body;
    assert!(
        metrics.contains("nitsum_requests_retried_total{tier=\"strict\"} 1"),
        "{metrics}"
    );
    assert_eq!(r.run.router.workers().len(), 1);
    assert_eq!(r.run.router.plan().groups.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_streaming_when_its_worker_dies_resumes_on_another_worker() {
    let r = start(config(), &[paced(20), paced(20)]).await;
    let prompt: Vec<u32> = vec![104, 105, 106, 107, 108];
    let body = json!({"input_ids": prompt, "stream": true,
                      "sampling_params": {"max_new_tokens": 40, "ignore_eos": true}});
    let mut s = send(&r, "POST", "/generate", &[], &body.to_string()).await;
    // Kill worker 0 once a few tokens have streamed.
    let mut head = read_until(&mut s, "output_ids").await;
    head.extend(read_until(&mut s, "output_ids").await);
    head.extend(read_until(&mut s, "output_ids").await);
    r.mocks[0].kill();
    let resp = read_response_after(s, head).await;
    let chunks = resp.sse_chunks();
    assert!(
        chunks.iter().all(|c| c.get("error").is_none()),
        "{chunks:?}"
    );
    let finish = &chunks.last().unwrap()["meta_info"]["finish_reason"];
    assert_eq!(finish["type"], "length", "{finish}");
    // Chunks are cumulative (SGLang's format), across the resume too: the last holds it all.
    let ids = |c: &Value| -> Vec<u32> {
        let ids = c["output_ids"].as_array().unwrap();
        ids.iter().map(|v| v.as_u64().unwrap() as u32).collect()
    };
    for pair in chunks.windows(2) {
        let (a, b) = (ids(&pair[0]), ids(&pair[1]));
        assert!(b.starts_with(&a), "{a:?} then {b:?}");
    }
    let streamed = ids(chunks.last().unwrap());
    // Worker 1 got the rest: the prompt extended by what worker 0 streamed (the mock echoes
    // its prompt), and only the tokens still owed.
    assert_eq!(r.mocks[1].stats.generates.load(Ordering::Relaxed), 1);
    let (input, left) = r.mocks[1].stats.last_input.lock().unwrap().clone().unwrap();
    let k = 40 - left as usize;
    assert!((3..40).contains(&k), "resumed after {k} tokens");
    let before: Vec<u32> = (0..k).map(|i| prompt[i % prompt.len()]).collect();
    assert_eq!(input, [prompt.clone(), before.clone()].concat());
    // The client saw each token once: worker 0's k, then worker 1's echo of its input.
    let after: Vec<u32> = (0..left as usize).map(|i| input[i % input.len()]).collect();
    assert_eq!(streamed, [before, after].concat());
    assert_eq!(r.run.router.inflight(), 0);
    let metrics = call(&r, "GET", "/metrics", &[], "").await.body;
    for line in [
        "nitsum_requests_resumed_total{tier=\"strict\"} 1",
        "nitsum_requests_error_total{tier=\"strict\"} 0",
        "nitsum_requests_finished_total{tier=\"strict\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_whose_retries_are_spent_ends_with_an_error() {
    let cfg = RouterConfig {
        max_retries: 0,
        ..config()
    };
    let r = start(cfg, &[paced(20), paced(20)]).await;
    let body = json!({"model": "tiny", "messages": [{"role": "user", "content": "hello"}],
                      "max_tokens": 40, "ignore_eos": true, "stream": true});
    let mut s = send(&r, "POST", "/v1/chat/completions", &[], &body.to_string()).await;
    let head = read_until(&mut s, "\"content\":\"s").await;
    r.mocks[0].kill();
    let resp = read_response_after(s, head).await;
    let chunks = resp.sse_chunks();
    let last = chunks.last().unwrap();
    let why = last["error"]["message"].as_str().unwrap();
    assert!(why.contains("worker 0 died"), "{last}");
    assert_eq!(r.mocks[1].stats.generates.load(Ordering::Relaxed), 0);
    assert_eq!(r.run.router.inflight(), 0);
    let metrics = call(&r, "GET", "/metrics", &[], "").await.body;
    assert!(
        metrics.contains("nitsum_requests_error_total{tier=\"strict\"} 1"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_disconnect_mid_stream_aborts_on_the_worker() {
    let r = start(config(), &[paced(10)]).await;
    let body = json!({"model": "tiny", "prompt": "abc", "max_tokens": 50, "stream": true});
    let mut s = send(&r, "POST", "/v1/completions", &[], &body.to_string()).await;
    let mut buf = [0u8; 512];
    let n = s.read(&mut buf).await.unwrap();
    assert!(n > 0);
    wait_until(|| r.run.router.inflight() == 1).await;
    drop(s);
    wait_until(|| r.mocks[0].stats.aborts.load(Ordering::Relaxed) == 1).await;
    wait_until(|| r.run.router.inflight() == 0).await;
    let metrics = call(&r, "GET", "/metrics", &[], "").await.body;
    assert!(
        metrics.contains("nitsum_requests_cancelled_total{tier=\"strict\"} 1"),
        "{metrics}"
    );
}
