//! A mock device worker speaking the real protocol (docs/protocol.md) over a ZeroMQ DEALER
//! socket. It answers `generate` by echoing the prompt's token ids cyclically (output token
//! `i` is `input_ids[i % len]`), instantly or at a fixed pace. It acknowledges `reconfigure`
//! (or refuses it, or stays silent, for tests of the control loop). Used by the integration tests,
//! the benchmark and `nitsum-router --mock-workers N`.
//!
//! One mock worker's connection is `session.rs`; what it streams `output.rs`.

mod echo_output;
mod sealed;
mod session;

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::task::JoinHandle;
use zeromq::{DealerSocket, Socket};

use crate::ids::WorkerId;
use crate::worker_auth::WorkerSecret;

/// How a mock worker behaves.
#[derive(Debug, Clone)]
pub struct MockOptions {
    /// Tokens per `tokens` message (0 = all in one message).
    pub tokens_per_message: usize,
    /// Delay before each `tokens` message (0 = reply inline, instantly).
    pub step_delay: Duration,
    pub heartbeat: Duration,
    pub max_context: u64,
    pub eos_token_ids: Vec<u32>,
    /// TP levels sent in `register`.
    pub tp_levels: Vec<u32>,
    /// Domain (host worker process) sent in `register`; `None`: the field is left out.
    pub domain: Option<u32>,
    /// Answer `reconfigure` with `ok: false` when this worker's group has a TP level above
    /// this (a single-device worker cannot join a TP group: `Some(1)`).
    pub refuse_tp_above: Option<u32>,
    /// Never answer `reconfigure` (a hung worker).
    pub ignore_reconfigure: bool,
    /// Model name sent in `register` (the router refuses another than its served model).
    pub model: String,
    /// Shared secret to answer the router's `challenge` with (docs/security.md).
    pub secret: Option<WorkerSecret>,
    /// `queue_ms` sent with each request's first tokens (as a worker reports its queue time).
    pub queue_ms: Option<f64>,
    /// Send a `stats` message with every heartbeat, shaped like a host worker's: cumulative
    /// `prefix_cache_queries` (prompt tokens received), `prefix_cache_hits` (half of them,
    /// rounded down per request), `num_preemptions` (one per `generate`) and the gauge
    /// `kv_cache_usage_perc` (25).
    pub report_stats: bool,
    /// More fields of that `stats` message (a map: binding counters, `last_bind`), as given.
    pub stats_extra: serde_json::Map<String, serde_json::Value>,
}

impl Default for MockOptions {
    fn default() -> Self {
        MockOptions {
            tokens_per_message: 0,
            step_delay: Duration::ZERO,
            heartbeat: Duration::from_millis(500),
            max_context: 4096,
            eos_token_ids: Vec::new(),
            tp_levels: vec![1],
            domain: None,
            refuse_tp_above: None,
            ignore_reconfigure: false,
            model: "nitsum".into(),
            secret: None,
            queue_ms: None,
            report_stats: false,
            stats_extra: serde_json::Map::new(),
        }
    }
}

/// Counters a test can assert on.
#[derive(Debug, Default)]
pub struct MockStats {
    pub generates: AtomicU64,
    pub aborts: AtomicU64,
    pub reconfigures: AtomicU64,
    pub registered: AtomicU64,
    /// Refused `reconfigure`s.
    pub refused: AtomicU64,
    /// (epoch, this worker's group: tp and max_batch) of the last `reconfigure`.
    pub last_reconfigure: Mutex<Option<(u64, u32, Option<u32>)>>,
    /// (tier, class, decode_target) of the last `generate`.
    pub last_generate: Mutex<Option<(String, String, Option<WorkerId>)>>,
    /// (input_ids, max_tokens) of the last `generate`.
    pub last_input: Mutex<Option<(Vec<u32>, u32)>>,
    /// The grammar of the last `generate` (structured output, forced tool calls).
    pub last_grammar: Mutex<Option<crate::protocols::structured::Grammar>>,
    /// Prompt tokens received, and half of each prompt's (rounded down), summed.
    pub prompt_tokens: AtomicU64,
    pub half_prompt_tokens: AtomicU64,
}

/// A running mock worker.
pub struct MockWorker {
    pub id: WorkerId,
    pub stats: Arc<MockStats>,
    task: JoinHandle<()>,
}

impl MockWorker {
    /// Stop it abruptly: no more replies, no more heartbeats (simulates a crash).
    pub fn kill(&self) {
        self.task.abort();
    }
}

impl Drop for MockWorker {
    fn drop(&mut self) {
        self.task.abort();
    }
}
/// Connect a mock worker with id `id` to the router at `addr`.
pub async fn spawn(addr: &str, id: WorkerId, opts: MockOptions) -> Result<MockWorker> {
    // NOTE: a random routing identity (the default), as real workers use: a guessable one
    // would let another peer take over this connection's routing slot (docs/security.md).
    let mut sock = DealerSocket::new();
    sock.connect(addr)
        .await
        .with_context(|| format!("mock worker {id} connecting to {addr}"))?;
    let stats = Arc::new(MockStats::default());
    let task = tokio::spawn(session::run(sock, id, opts, stats.clone()));
    Ok(MockWorker { id, stats, task })
}

/// Spawn `n` mock workers with ids `0..n`.
pub async fn spawn_many(addr: &str, n: u32, opts: &MockOptions) -> Result<Vec<MockWorker>> {
    let mut v = Vec::with_capacity(n as usize);
    for id in 0..n {
        v.push(spawn(addr, WorkerId(id), opts.clone()).await?);
    }
    Ok(v)
}
