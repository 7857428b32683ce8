//! Helpers for the end-to-end tests: start a router on ephemeral ports with mock workers,
//! and a minimal HTTP/1.1 client (no extra dependencies).

#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use nitsum_scheduler::config::RouterConfig;
use nitsum_scheduler::ids::WorkerId;
use nitsum_scheduler::mock_worker::{self, MockOptions, MockWorker};
use nitsum_scheduler::server::{self, Running};
use nitsum_scheduler::testutil::{self, TempDir};
use nitsum_scheduler::tokenize::ModelFiles;
use nitsum_scheduler::worker_auth::WorkerSecret;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub struct Router {
    pub run: Running,
    pub mocks: Vec<MockWorker>,
    _model_dir: TempDir,
}

impl Drop for Router {
    fn drop(&mut self) {
        self.run.stop();
    }
}

pub fn config() -> RouterConfig {
    RouterConfig {
        listen: "127.0.0.1:0".into(),
        worker_addr: "tcp://127.0.0.1:0".into(),
        served_model_name: "tiny".into(),
        heartbeat_timeout_ms: 400,
        // NOTE: a killed mock is gone soon after it is suspect (the default waits 30 s).
        worker_gone_ms: 800,
        worker_secret: Some(WorkerSecret::generate()),
        ..RouterConfig::default()
    }
}

/// A mock worker that streams one token per message, `ms` apart.
pub fn paced(ms: u64) -> MockOptions {
    MockOptions {
        tokens_per_message: 1,
        step_delay: Duration::from_millis(ms),
        ..MockOptions::default()
    }
}

/// Start a router with the tiny model and one mock worker per entry of `workers`.
pub async fn start(cfg: RouterConfig, workers: &[MockOptions]) -> Router {
    start_in(cfg, workers, testutil::tiny_model_dir()).await
}

/// `start` with the model directory `dir` (e.g. the tiny model with a longer context).
pub async fn start_in(cfg: RouterConfig, workers: &[MockOptions], dir: TempDir) -> Router {
    let model = Arc::new(ModelFiles::load(dir.path()).unwrap());
    let run = server::start(cfg, Some(model)).await.unwrap();
    let mut mocks = Vec::new();
    for (id, opts) in workers.iter().enumerate() {
        let opts = MockOptions {
            heartbeat: Duration::from_millis(50),
            ..authenticated(&run, opts.clone())
        };
        mocks.push(
            mock_worker::spawn(&run.worker_endpoint, WorkerId(id as u32), opts)
                .await
                .unwrap(),
        );
    }
    wait_until(|| run.router.workers().len() == workers.len()).await;
    Router {
        run,
        mocks,
        _model_dir: dir,
    }
}

/// `opts` with the model name and secret that pass `run`'s handshake.
pub fn authenticated(run: &Running, opts: MockOptions) -> MockOptions {
    MockOptions {
        model: run.router.cfg.served_model_name.clone(),
        secret: run.router.cfg.worker_secret.clone(),
        ..opts
    }
}

/// Poll `cond` every 5 ms for up to 5 s.
pub async fn wait_until(cond: impl Fn() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "condition not reached in 5 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Response status and decoded body.
pub struct Resp {
    pub status: u16,
    pub headers: String,
    pub body: String,
}

impl Resp {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    /// `data:` payloads of an SSE body.
    pub fn sse(&self) -> Vec<String> {
        self.body
            .lines()
            .filter_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
            .map(String::from)
            .collect()
    }

    /// The JSON chunks of an SSE body, which must end with `[DONE]`.
    pub fn sse_chunks(&self) -> Vec<Value> {
        let data = self.sse();
        assert_eq!(
            data.last().map(String::as_str),
            Some("[DONE]"),
            "{}",
            self.body
        );
        data[..data.len() - 1]
            .iter()
            .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}")))
            .collect()
    }
}

/// The raw bytes of an HTTP/1.1 request that closes its connection after the answer.
pub fn request_bytes(method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Vec<u8> {
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    req.into_bytes()
}

/// Open a connection and send a request; the caller reads (or drops) the stream.
pub async fn send(
    r: &Router,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> TcpStream {
    let mut s = TcpStream::connect(r.run.http_addr).await.unwrap();
    // NOTE: the server may answer before the body is all sent (413 on a declared oversize
    // body) and close: the caller reads that answer.
    if let Err(e) = s
        .write_all(&request_bytes(method, path, headers, body))
        .await
    {
        use std::io::ErrorKind::{BrokenPipe, ConnectionReset};
        assert!(matches!(e.kind(), BrokenPipe | ConnectionReset), "{e}");
    }
    s
}

/// Read from `s` until `needle` has arrived; returns the bytes read so far.
pub async fn read_until(s: &mut TcpStream, needle: &str) -> Vec<u8> {
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&raw).contains(needle) {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
            .await
            .expect("data within 10 s")
            .unwrap();
        assert!(n > 0, "closed before {needle:?} arrived");
        raw.extend_from_slice(&buf[..n]);
    }
    raw
}

/// Read a whole response from `s`.
pub async fn read_response(s: TcpStream) -> Resp {
    read_response_after(s, Vec::new()).await
}

/// Read the rest of a response whose first bytes (`raw`) were already read.
pub async fn read_response_after(mut s: TcpStream, mut raw: Vec<u8>) -> Resp {
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut raw))
        .await
        .expect("response within 10 s")
        .unwrap();
    let text = String::from_utf8(raw).expect("UTF-8 response");
    let (head, body) = text.split_once("\r\n\r\n").expect("header end");
    let status = head[9..12].parse().unwrap();
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    Resp {
        status,
        headers: head.to_string(),
        body,
    }
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    loop {
        let (size, rest) = s.split_once("\r\n").expect("chunk size line");
        let n = usize::from_str_radix(size.trim(), 16).unwrap();
        if n == 0 {
            return out;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
}

pub async fn call(
    r: &Router,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Resp {
    read_response(send(r, method, path, headers, body).await).await
}

pub async fn post(r: &Router, path: &str, body: Value) -> Resp {
    call(r, "POST", path, &[], &body.to_string()).await
}

/// An OpenAI-shaped error answer's status and `param` (asserting the shape).
pub fn err(resp: &Resp) -> (u16, Value) {
    let v = resp.json();
    for k in ["message", "type", "param", "code"] {
        assert!(v["error"].get(k).is_some(), "missing error.{k} in {v}");
    }
    (resp.status, v["error"]["param"].clone())
}
