//! Failure paths end to end: a worker dies (retry or explicit error) and a client
//! disconnects (abort reaches the worker). architecture §7: one completion or one error each.

mod common;

use std::sync::atomic::Ordering;

use common::*;
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
async fn request_streaming_when_its_worker_dies_ends_with_an_error() {
    let r = start(config(), &[paced(20), paced(20)]).await;
    let body = json!({"model": "tiny", "messages": [{"role": "user", "content": "hello"}],
                      "max_tokens": 40, "ignore_eos": true, "stream": true});
    let mut s = send(&r, "POST", "/v1/chat/completions", &[], &body.to_string()).await;
    // Kill the worker once some content has streamed (the echo starts with "user").
    let head = read_until(&mut s, "\"content\":\"s").await;
    assert_eq!(r.mocks[0].stats.generates.load(Ordering::Relaxed), 1);
    r.mocks[0].kill();
    let resp = read_response_after(s, head).await;
    let data = resp.sse();
    assert_eq!(data.last().unwrap(), "[DONE]");
    let last: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
    assert!(
        last["error"]["message"]
            .as_str()
            .unwrap()
            .contains("died while streaming"),
        "{last}"
    );
    // Some content was streamed before the failure, and the request was not retried.
    assert!(data.len() > 4);
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
    let body = json!({"prompt": "abc", "max_tokens": 50, "stream": true});
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
