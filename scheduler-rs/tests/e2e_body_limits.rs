//! Request bodies at the HTTP framing level (issue 29 item 8), over raw sockets: a declared
//! `Content-Length` past the limit gets its 413 at once, before any body byte (also with
//! `Expect: 100-continue`: 413 instead of `100 Continue`), a malformed chunk size is a 400,
//! and the router serves normally after each.

mod common;

use std::time::{Duration, Instant};

use common::*;
use nitsum_scheduler::mock_worker::MockOptions;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Send `head` (the request line and headers, up to the blank line) and maybe a body prefix;
/// the first response's status line, and how long it took to arrive.
async fn first_status(r: &Router, head: &str, body: &[u8]) -> (String, Duration, Vec<u8>) {
    let mut s = TcpStream::connect(r.run.http_addr).await.unwrap();
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body).await.unwrap();
    let t0 = Instant::now();
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    // NOTE: up to the end of the headers; a test that hung here would be the bug itself.
    while !raw.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
            .await
            .expect("an answer within 5 s")
            .unwrap();
        assert!(n > 0, "connection closed without an answer");
        raw.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&raw).to_string();
    let line = text.lines().next().unwrap_or_default().to_string();
    // The rest of the answer, when the server closes the connection after it.
    let _ = tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut raw)).await;
    (line, t0.elapsed(), raw)
}

fn json_body(raw: &[u8]) -> serde_json::Value {
    let text = String::from_utf8_lossy(raw);
    let (_, body) = text.split_once("\r\n\r\n").expect("header end");
    serde_json::from_str(body.trim()).unwrap_or_else(|e| panic!("{e}: {body}"))
}

async fn still_serves(r: &Router) {
    let ok = post(
        r,
        "/generate",
        json!({"input_ids": [104, 105], "sampling_params": {"max_new_tokens": 3,
               "ignore_eos": true}}),
    )
    .await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    assert_eq!(ok.json()["output_ids"], json!([104, 105, 104]));
}

fn head(extra: &str) -> String {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n\
         {extra}\r\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_declared_body_gets_413_before_it_is_sent() {
    let r = start(config(), &[MockOptions::default()]).await;
    for extra in [
        "Content-Length: 1000000000000000000\r\n",
        "Content-Length: 5000000000\r\nExpect: 100-continue\r\n",
        "Content-Length: 2097153\r\n",
    ] {
        // Only the headers and a few body bytes: the answer must not wait for the rest.
        let (line, took, raw) = first_status(&r, &head(extra), b"{\"model\"").await;
        assert_eq!(line, "HTTP/1.1 413 Payload Too Large", "{extra}");
        assert!(took < Duration::from_secs(1), "{extra}: {took:?}");
        let err = json_body(&raw)["error"].clone();
        assert_eq!(err["code"], "payload_too_large", "{err}");
        assert!(
            err["message"].as_str().unwrap().contains("Content-Length"),
            "{err}"
        );
        still_serves(&r).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_continue_within_the_limit_still_gets_100_then_its_answer() {
    let r = start(config(), &[MockOptions::default()]).await;
    let body = json!({"input_ids": [104, 105], "sampling_params": {"max_new_tokens": 3,
                      "ignore_eos": true}})
    .to_string();
    let mut s = TcpStream::connect(r.run.http_addr).await.unwrap();
    let head = format!(
        "POST /generate HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Length: {}\r\n\
         Expect: 100-continue\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let cont = read_until(&mut s, "\r\n\r\n").await;
    assert!(
        cont.starts_with(b"HTTP/1.1 100 Continue"),
        "{}",
        String::from_utf8_lossy(&cont)
    );
    s.write_all(body.as_bytes()).await.unwrap();
    let resp = read_response(s).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(resp.json()["output_ids"], json!([104, 105, 104]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_chunk_size_is_a_400_not_a_413() {
    let r = start(config(), &[MockOptions::default()]).await;
    for chunks in [
        &b"zz\r\n{}\r\n0\r\n\r\n"[..],
        b"-1\r\n",
        b"1G\r\n{\r\n0\r\n\r\n",
    ] {
        let (line, took, raw) =
            first_status(&r, &head("Transfer-Encoding: chunked\r\n"), chunks).await;
        let shown = String::from_utf8_lossy(chunks);
        assert_eq!(line, "HTTP/1.1 400 Bad Request", "{shown}");
        assert!(took < Duration::from_secs(1), "{shown}: {took:?}");
        let err = json_body(&raw)["error"].clone();
        assert_eq!(err["type"], "invalid_request_error", "{err}");
        assert!(
            err["message"]
                .as_str()
                .unwrap()
                .contains("malformed request body"),
            "{err}"
        );
        still_serves(&r).await;
    }
}
