//! One JSON POST over HTTP/1.1 (hyper's client, one connection per call): all the etcd
//! lease needs of its v3 JSON gateway.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;

/// Largest answer read (etcd's answers to the lease calls are a few hundred bytes).
const MAX_ANSWER_BYTES: usize = 1 << 20;

/// `POST {base}{path}` with the JSON `body`; the answer's JSON, whatever its status (etcd's
/// gateway reports errors as JSON with `error` and `code`). Bounded by `timeout` in all.
pub async fn post_json(
    base: &str,
    path: &str,
    body: &serde_json::Value,
    timeout: Duration,
) -> Result<serde_json::Value> {
    tokio::time::timeout(timeout, post(base, path, body))
        .await
        .with_context(|| format!("{base}{path}: no answer within {timeout:?}"))?
}

async fn post(base: &str, path: &str, body: &serde_json::Value) -> Result<serde_json::Value> {
    let authority = base
        .strip_prefix("http://")
        .with_context(|| format!("{base}: only http:// endpoints are supported"))?
        .trim_end_matches('/');
    let stream = tokio::net::TcpStream::connect(authority)
        .await
        .with_context(|| format!("connecting to {authority}"))?;
    stream.set_nodelay(true).ok();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    // NOTE: the connection task ends with the request (the sender is dropped below).
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let request = hyper::Request::post(path)
        .header(hyper::header::HOST, authority)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec(body)?)))?;
    let answer = sender.send_request(request).await?;
    let bytes = answer.into_body().collect().await?.to_bytes();
    if bytes.len() > MAX_ANSWER_BYTES {
        bail!("{base}{path}: answer of {} bytes", bytes.len());
    }
    serde_json::from_slice(&bytes).with_context(|| format!("{base}{path}: an answer not JSON"))
}
