//! Deadlines (issue 11): a request past `request_timeout_ms` ends with 408 (streaming: an SSE
//! error event and `[DONE]`) and is aborted on its worker; a client too slow to send its
//! headers or its body is cut off after `client_read_timeout_ms`, and the router still serves
//! everyone else.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::*;
use nitsum_scheduler::ids::TierId;
use nitsum_scheduler::mock_worker::MockOptions;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn generate(n: u32) -> Value {
    json!({"input_ids": [104, 105], "sampling_params": {"max_new_tokens": n, "ignore_eos": true}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_past_its_deadline_gets_408_and_is_aborted_on_the_worker() {
    let mut cfg = config();
    cfg.request_timeout_ms = 400;
    let r = start(cfg, &[paced(100)]).await;
    // 3 tokens at 100 ms each fit; 50 do not.
    let quick = post(&r, "/generate", generate(3)).await;
    assert_eq!(quick.status, 200, "{}", quick.body);
    assert_eq!(quick.json()["output_ids"], json!([104, 105, 104]));
    let started = Instant::now();
    let late = post(&r, "/generate", generate(50)).await;
    let took = started.elapsed();
    assert_eq!(late.status, 408, "{}", late.body);
    let e = late.json();
    assert_eq!(e["error"]["code"], "request_timeout", "{e}");
    assert!(
        took < Duration::from_millis(1500),
        "answered after {took:?}"
    );
    // The worker was told to stop: nothing stays in flight, and the metric counts it.
    wait_until(|| r.run.router.inflight() == 0).await;
    let metrics = call(&r, "GET", "/metrics", &[], "").await.body;
    let line = metrics
        .lines()
        .find(|l| l.starts_with("nitsum_requests_timed_out_total{tier=\"strict\"}"))
        .unwrap_or_else(|| panic!("no timed_out counter in\n{metrics}"));
    assert!(line.ends_with(" 1"), "{line}");
    let m = r.run.router.metrics.tier(TierId(0));
    assert_eq!(m.timed_out.load(Ordering::Relaxed), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_past_its_deadline_ends_with_an_error_event_and_done() {
    let mut cfg = config();
    cfg.request_timeout_ms = 350;
    let r = start(cfg, &[paced(100)]).await;
    let body = json!({"model": "tiny", "prompt": "hi", "stream": true, "max_tokens": 50,
                      "ignore_eos": true});
    let resp = post(&r, "/v1/completions", body).await;
    assert_eq!(resp.status, 200);
    let data = resp.sse();
    assert_eq!(data.last().unwrap(), "[DONE]", "{data:?}");
    let error: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
    assert_eq!(error["error"]["code"], "request_timeout", "{error}");
    // Some tokens streamed before the deadline, and none after it.
    let chunks = data.len() - 2;
    assert!((1..=4).contains(&chunks), "{chunks} chunks: {data:?}");
    wait_until(|| r.run.router.inflight() == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_are_cut_off_and_others_are_still_served() {
    let mut cfg = config();
    cfg.client_read_timeout_ms = 300;
    let r = start(cfg, &[MockOptions::default()]).await;
    // Headers one byte at a time, never finished: the connection is closed.
    let mut trickle = TcpStream::connect(r.run.http_addr).await.unwrap();
    let started = Instant::now();
    let closed = async {
        for b in b"POST /generate HTTP/1.1\r\nHost: x\r\n".iter().cycle() {
            if trickle.write_all(&[*b]).await.is_err() {
                break;
            }
            let mut buf = [0u8; 256];
            match tokio::time::timeout(Duration::from_millis(50), trickle.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => break,
                _ => {}
            }
            assert!(started.elapsed() < Duration::from_secs(5), "never cut off");
        }
        started.elapsed()
    };
    // Meanwhile a normal request is answered.
    let (cut_after, normal) = tokio::join!(closed, post(&r, "/generate", generate(2)));
    assert!(
        cut_after >= Duration::from_millis(250),
        "cut after {cut_after:?}"
    );
    assert_eq!(normal.status, 200, "{}", normal.body);
    // Headers sent, body promised but only half sent: 408 in the OpenAI shape.
    let mut half = TcpStream::connect(r.run.http_addr).await.unwrap();
    let body = generate(2).to_string();
    let head = format!(
        "POST /generate HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    half.write_all(head.as_bytes()).await.unwrap();
    half.write_all(&body.as_bytes()[..body.len() / 2])
        .await
        .unwrap();
    let resp = read_response(half).await;
    assert_eq!(resp.status, 408, "{}", resp.body);
    assert_eq!(resp.json()["error"]["code"], "request_timeout");
    let after = post(&r, "/generate", generate(2)).await;
    assert_eq!(after.json()["output_ids"], json!([104, 105]));
}
