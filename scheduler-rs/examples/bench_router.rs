//! Router benchmark (run by `scripts/bench_router.sh`).
//!
//! Everything runs in one process on a 2-thread tokio runtime: the router (engine, dispatcher,
//! ZeroMQ ROUTER socket over loopback TCP), N mock workers (each its own DEALER socket and
//! TCP connection; they reply instantly with all tokens in one `tokens` message) and the load
//! generator. So the numbers include the mocks' own msgpack/ZeroMQ work on the same cores.
//!
//! 1. dispatch throughput: pre-tokenized requests submitted straight to the engine (dispatch +
//!    msgpack + ZeroMQ out, mock reply, ZeroMQ in + completion accounting), closed loop.
//! 2. router-added latency at a fixed open-loop rate on the same path (submit → final event).
//! 3. the same two over the full HTTP path (`POST /generate` with `input_ids`, keep-alive
//!    HTTP/1.1 connections, JSON both ways).

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use futures_util::stream::{FuturesUnordered, StreamExt};
use nitsum_scheduler::config::RouterConfig;
use nitsum_scheduler::ids::TierId;
use nitsum_scheduler::mock_worker::{self, MockOptions};
use nitsum_scheduler::protocols::worker::{Sampling, Stop};
use nitsum_scheduler::server;
use nitsum_scheduler::state::{Event, RouterState, Submit};
use nitsum_scheduler::testutil;
use nitsum_scheduler::tokenize::ModelFiles;
use nitsum_scheduler::worker_auth::WorkerSecret;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Nitsum's reported router dispatch throughput (paper, 128 replicas).
const REFERENCE_RPS: f64 = 16_100.0;

#[derive(Parser, Debug)]
struct Args {
    /// Requests for the throughput runs.
    #[arg(long, default_value_t = 50_000)]
    requests: usize,
    /// Mock worker replicas (each its own TP-1 group).
    #[arg(long, default_value_t = 128)]
    replicas: u32,
    /// Requests in flight in the closed-loop throughput runs.
    #[arg(long, default_value_t = 1024)]
    window: usize,
    /// Prompt length in tokens.
    #[arg(long, default_value_t = 64)]
    prompt_tokens: usize,
    /// Output tokens per request (returned by the mock in one message).
    #[arg(long, default_value_t = 8)]
    max_tokens: u32,
    /// Open-loop rate for the latency runs (req/s).
    #[arg(long, default_value_t = 1000.0)]
    rate: f64,
    /// Requests in each latency run.
    #[arg(long, default_value_t = 5000)]
    latency_requests: usize,
    /// Keep-alive HTTP connections for the HTTP throughput run.
    #[arg(long, default_value_t = 64)]
    http_connections: usize,
    /// Skip the HTTP runs.
    #[arg(long)]
    no_http: bool,
}

fn make_request(i: usize, args: &Args) -> Submit {
    Submit {
        // Printable ASCII ids of the tiny byte-level tokenizer, so detokenization does real work.
        input_ids: (0..args.prompt_tokens)
            .map(|j| (32 + (i * 31 + j * 7) % 95) as u32)
            .collect(),
        resumed_tokens: 0,
        sampling: Sampling {
            temperature: 0.0,
            ..Sampling::default()
        },
        stop: Stop {
            max_tokens: args.max_tokens,
            ..Stop::default()
        },
        output: Default::default(),
        tier: TierId(0),
        priority: 0,
        fork_of: None,
        grammar: None,
        cache: Default::default(),
    }
}

/// Submit and wait for the final event; true on a completion.
async fn run_one(engine: &Arc<RouterState>, req: Submit) -> bool {
    let Ok(mut h) = engine.submit(req) else {
        return false;
    };
    while let Some(ev) = h.recv().await {
        match ev {
            Event::Tokens {
                finish: Some(_), ..
            } => return true,
            Event::Error(_) | Event::Invalid { .. } => return false,
            _ => {}
        }
    }
    false
}

/// User + system CPU seconds of this process so far (Linux; 0 elsewhere).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // NOTE: USER_HZ is 100 on every mainstream Linux configuration.
    (ticks(11) + ticks(12)) / 100.0
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn report_latency(name: &str, mut lat_us: Vec<f64>) -> (f64, f64) {
    lat_us.sort_by(f64::total_cmp);
    let (p50, p99, p999) = (
        percentile(&lat_us, 0.5),
        percentile(&lat_us, 0.99),
        percentile(&lat_us, 0.999),
    );
    println!(
        "{name}: n={} p50={p50:.0} us  p99={p99:.0} us  p99.9={p999:.0} us  max={:.0} us",
        lat_us.len(),
        lat_us.last().unwrap()
    );
    (p50, p99)
}

async fn engine_throughput(
    engine: &Arc<RouterState>,
    reqs: Vec<Submit>,
    window: usize,
) -> (f64, usize) {
    let n = reqs.len();
    let mut it = reqs.into_iter();
    let mut inflight = FuturesUnordered::new();
    let mut ok = 0;
    let t0 = Instant::now();
    loop {
        while inflight.len() < window {
            let Some(r) = it.next() else { break };
            let e = engine.clone();
            inflight.push(async move { run_one(&e, r).await });
        }
        match inflight.next().await {
            Some(done) => ok += usize::from(done),
            None => break,
        }
    }
    (n as f64 / t0.elapsed().as_secs_f64(), ok)
}

async fn engine_latency(engine: &Arc<RouterState>, args: &Args) -> Vec<f64> {
    let period = Duration::from_secs_f64(1.0 / args.rate);
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::with_capacity(args.latency_requests);
    for i in 0..args.latency_requests {
        tokio::time::sleep_until(start + period * i as u32).await;
        let e = engine.clone();
        let req = make_request(i, args);
        tasks.push(tokio::spawn(async move {
            let t = Instant::now();
            assert!(run_one(&e, req).await, "request failed");
            t.elapsed().as_secs_f64() * 1e6
        }));
    }
    let mut lat = Vec::with_capacity(tasks.len());
    for t in tasks {
        lat.push(t.await.unwrap());
    }
    lat
}

/// The dispatcher alone: dispatch + complete with `window` requests outstanding.
fn dispatcher_only(replicas: u32, n: u64, window: u64) -> f64 {
    use nitsum_scheduler::dispatch::{DispatchRequest, Dispatcher};
    use nitsum_scheduler::plan::{GroupPlan, Plan, Role};
    // Every group serves both tiers of a two-tier list ("strict", "relaxed").
    let groups = (0..replicas)
        .map(|i| GroupPlan {
            members: vec![i],
            tp: 1,
            pp: 1,
            role: Role::Mixed,
            tiers: vec![TierId(0), TierId(1)],
            accepts_background: true,
            max_rps: 0.0,
            max_inflight: 0.0,
        })
        .collect();
    let mut d = Dispatcher::new(&Plan { epoch: 1, groups });
    let req = DispatchRequest {
        tier: TierId(0),
        background: false,
        affinity: None,
    };
    let t = Instant::now();
    for i in 0..n {
        d.dispatch(i, &req).expect("placed");
        if i >= window {
            d.complete(i - window);
        }
    }
    t.elapsed().as_nanos() as f64 / n as f64
}

/// A keep-alive HTTP/1.1 connection doing one request at a time.
struct Conn {
    s: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    async fn new(addr: std::net::SocketAddr) -> Conn {
        let s = TcpStream::connect(addr).await.unwrap();
        s.set_nodelay(true).unwrap();
        Conn {
            s,
            buf: Vec::with_capacity(4096),
        }
    }

    /// POST and return the response body (Content-Length responses only).
    async fn post(&mut self, path: &str, body: &str) -> (u16, Vec<u8>) {
        let req = format!(
            "POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        self.s.write_all(req.as_bytes()).await.unwrap();
        self.buf.clear();
        loop {
            if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = std::str::from_utf8(&self.buf[..end])
                    .unwrap()
                    .to_ascii_lowercase();
                let status: u16 = head[9..12].parse().unwrap();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map(|v| v.trim().parse().unwrap())
                    .expect("content-length");
                while self.buf.len() < end + 4 + len {
                    self.read_more().await;
                }
                return (status, self.buf[end + 4..end + 4 + len].to_vec());
            }
            self.read_more().await;
        }
    }

    async fn read_more(&mut self) {
        let mut chunk = [0u8; 8192];
        let n = self.s.read(&mut chunk).await.unwrap();
        assert!(n > 0, "connection closed");
        self.buf.extend_from_slice(&chunk[..n]);
    }
}

fn http_body(i: usize, args: &Args) -> String {
    let r = make_request(i, args);
    serde_json::json!({"input_ids": r.input_ids,
        "sampling_params": {"max_new_tokens": args.max_tokens, "temperature": 0.0}})
    .to_string()
}

async fn http_throughput(addr: std::net::SocketAddr, args: &Args) -> f64 {
    let bodies: Arc<Vec<String>> =
        Arc::new((0..args.requests).map(|i| http_body(i, args)).collect());
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..args.http_connections {
        let (bodies, next) = (bodies.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut c = Conn::new(addr).await;
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= bodies.len() {
                    return;
                }
                let (status, _) = c.post("/generate", &bodies[i]).await;
                assert_eq!(status, 200);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    args.requests as f64 / t0.elapsed().as_secs_f64()
}

async fn http_latency(addr: std::net::SocketAddr, args: &Args) -> Vec<f64> {
    // A pool of idle keep-alive connections so each request is one round trip.
    let pool = Arc::new(tokio::sync::Mutex::new(Vec::new()));
    for _ in 0..32 {
        pool.lock().await.push(Conn::new(addr).await);
    }
    let period = Duration::from_secs_f64(1.0 / args.rate);
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    for i in 0..args.latency_requests {
        tokio::time::sleep_until(start + period * i as u32).await;
        let body = http_body(i, args);
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = match pool.lock().await.pop() {
                Some(c) => c,
                None => Conn::new(addr).await,
            };
            let t = Instant::now();
            let (status, _) = c.post("/generate", &body).await;
            let us = t.elapsed().as_secs_f64() * 1e6;
            assert_eq!(status, 200);
            pool.lock().await.push(c);
            us
        }));
    }
    let mut lat = Vec::new();
    for t in tasks {
        lat.push(t.await.unwrap());
    }
    lat
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = Args::parse();
    let ns = dispatcher_only(args.replicas, 200_000, args.window as u64);
    println!(
        "[dispatcher only] {ns:.0} ns per dispatch+complete over {} groups",
        args.replicas
    );
    let cfg = RouterConfig {
        listen: "127.0.0.1:0".into(),
        worker_addr: "tcp://127.0.0.1:0".into(),
        worker_secret: Some(WorkerSecret::generate()),
        ..RouterConfig::default()
    };
    // The tiny byte-level tokenizer (with a 4096-token window) so the HTTP path validates
    // ids and detokenizes like it would with a real model.
    let dir = testutil::tiny_model_dir();
    std::fs::write(
        dir.path().join("config.json"),
        r#"{"max_position_embeddings": 4096}"#,
    )
    .unwrap();
    let model = Arc::new(ModelFiles::load(dir.path()).unwrap());
    let run = server::start(cfg, Some(model)).await.unwrap();
    let _mocks = mock_worker::spawn_many(&run.worker_endpoint, args.replicas, &mock_options(&run))
        .await
        .unwrap();
    let t0 = Instant::now();
    while run.router.plan().groups.len() < args.replicas as usize {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "workers did not register"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    println!(
        "setup: {} mock workers registered ({} TP-1 groups), runtime: 2 tokio threads, cores: {}",
        args.replicas,
        run.router.plan().groups.len(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let e = run.router.clone();
    // Warm-up (connections, allocations).
    let warm: Vec<Submit> = (0..2000).map(|i| make_request(i, &args)).collect();
    engine_throughput(&e, warm, args.window).await;

    let reqs: Vec<Submit> = (0..args.requests).map(|i| make_request(i, &args)).collect();
    let cpu0 = cpu_seconds();
    let (rps, ok) = engine_throughput(&e, reqs, args.window).await;
    let cpu = cpu_seconds() - cpu0;
    assert_eq!(ok, args.requests, "every request must complete");
    assert_eq!(e.inflight(), 0, "accounting must drain");
    println!(
        "[engine+zmq] dispatch throughput: {rps:.0} req/s ({} requests, window {}, prompt {} tok, {} out tok) = {:.2}x Nitsum's {:.1}k req/s",
        args.requests, args.window, args.prompt_tokens, args.max_tokens, rps / REFERENCE_RPS, REFERENCE_RPS / 1e3
    );
    println!(
        "[engine+zmq] CPU: {cpu:.2} s user+sys for {} requests = {:.1} us CPU per request (router + mock workers + load generator)",
        args.requests,
        cpu / args.requests as f64 * 1e6
    );
    let (_, p99) = report_latency(
        &format!(
            "[engine+zmq] latency at {:.0} req/s (submit -> final tokens, incl. mock worker)",
            args.rate
        ),
        engine_latency(&e, &args).await,
    );
    let mut summary = serde_json::json!({
        "replicas": args.replicas, "requests": args.requests, "dispatcher_ns": ns.round(),
        "engine_zmq_rps": rps.round(), "engine_zmq_ratio_vs_16_1k": (rps / REFERENCE_RPS * 100.0).round() / 100.0,
        "engine_zmq_p99_us_at_rate": p99.round(), "rate": args.rate,
        "engine_zmq_cpu_us_per_request": (cpu / args.requests as f64 * 1e7).round() / 10.0,
    });
    if !args.no_http {
        let addr = run.http_addr;
        let hrps = http_throughput(addr, &args).await;
        println!(
            "[http] /generate throughput: {hrps:.0} req/s ({} requests over {} keep-alive connections) = {:.2}x Nitsum's 16.1k",
            args.requests, args.http_connections, hrps / REFERENCE_RPS
        );
        let (_, hp99) = report_latency(
            &format!("[http] /generate latency at {:.0} req/s (request write -> full response, incl. mock)", args.rate),
            http_latency(addr, &args).await,
        );
        summary["http_rps"] = serde_json::json!(hrps.round());
        summary["http_ratio_vs_16_1k"] =
            serde_json::json!((hrps / REFERENCE_RPS * 100.0).round() / 100.0);
        summary["http_p99_us_at_rate"] = serde_json::json!(hp99.round());
    }
    println!("summary: {summary}");
    run.stop();
}

/// Mock workers that pass the router's handshake (its model name and secret).
fn mock_options(run: &server::Running) -> MockOptions {
    MockOptions {
        model: run.router.cfg.served_model_name.clone(),
        secret: run.router.cfg.worker_secret.clone(),
        ..MockOptions::default()
    }
}
