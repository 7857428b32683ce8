//! A mock device worker speaking the real protocol (docs/protocol.md) over a ZeroMQ DEALER
//! socket. It answers `generate` by echoing the prompt's token ids cyclically (output token
//! `i` is `input_ids[i % len]`), instantly or at a fixed pace. It acknowledges `reconfigure`
//! (or refuses it, or stays silent, for tests of the control loop). Used by the integration tests,
//! the benchmark and `nitsum-router --mock-workers N`.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use crate::ids::WorkerId;
use crate::protocols::worker::{Sampling, PROTOCOL_VERSION};
use crate::worker_auth::{HandshakeNonces, Nonce, WorkerSecret, HANDSHAKE_VERSION};

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

/// Router → worker message, decoded flat (fields of all types optional).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RouterMsg {
    #[serde(rename = "type")]
    ty: String,
    request_id: String,
    input_ids: Vec<u32>,
    sampling: Option<Sampling>,
    epoch: u64,
    tier: String,
    class: String,
    nonce: String,
    proof: String,
    decode_target: Option<WorkerId>,
    groups: Vec<MockGroup>,
    grammar: Option<crate::protocols::structured::Grammar>,
}

/// A `reconfigure` group as the mock reads it.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct MockGroup {
    members: Vec<u32>,
    tp: u32,
    max_batch: Option<u32>,
}

#[derive(Serialize)]
struct Tokens<'a> {
    v: u32,
    #[serde(rename = "type")]
    ty: &'static str,
    worker_id: WorkerId,
    request_id: &'a str,
    token_ids: &'a [u32],
    finish_reason: Option<&'a str>,
    error: Option<&'a str>,
    prompt_tokens: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    queue_ms: Option<f64>,
}

fn encode<T: Serialize>(v: &T) -> ZmqMessage {
    ZmqMessage::from(rmp_serde::to_vec_named(v).expect("msgpack encode"))
}

/// The mock's full output for a request and whether it ended on a stop token.
fn plan_output(input: &[u32], s: &Sampling) -> (Vec<u32>, &'static str) {
    let mut out = Vec::with_capacity(s.max_tokens as usize);
    for i in 0..s.max_tokens as usize {
        let tok = if input.is_empty() {
            i as u32
        } else {
            input[i % input.len()]
        };
        out.push(tok);
        if !s.ignore_eos && s.stop_token_ids.contains(&tok) {
            return (out, "stop");
        }
    }
    (out, "length")
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
    let task = tokio::spawn(run(sock, id, opts, stats.clone()));
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

async fn run(mut sock: DealerSocket, id: WorkerId, opts: MockOptions, stats: Arc<MockStats>) {
    let mut register = serde_json::json!({"v": PROTOCOL_VERSION, "type": "register", "worker_id": id,
        "device": "mock", "model": opts.model, "tp_levels": opts.tp_levels, "kv_capacity_tokens": 1u64 << 20,
        "max_context": opts.max_context, "eos_token_ids": opts.eos_token_ids});
    if let Some(domain) = opts.domain {
        register["domain"] = domain.into();
    }
    // With a secret, `hello` (a fresh nonce each time) opens the handshake; else `register`.
    let mut our_nonce = Nonce::random();
    let opening = |nonce: &Nonce| match &opts.secret {
        Some(_) => encode(&serde_json::json!({"v": PROTOCOL_VERSION, "type": "hello",
            "worker_id": id, "handshake": HANDSHAKE_VERSION, "nonce": nonce.to_hex()})),
        None => encode(&register),
    };
    let _ = sock.send(opening(&our_nonce)).await;
    let mut beat = tokio::time::interval(opts.heartbeat);
    let mut registered = false;
    let mut ticks = 0u64;
    let aborted: Arc<Mutex<HashSet<String>>> = Arc::default();
    let (paced_tx, mut paced_rx) = mpsc::unbounded_channel::<ZmqMessage>();
    loop {
        tokio::select! {
            msg = sock.recv() => {
                let Ok(msg) = msg else { continue };
                let Some(body) = msg.into_vec().pop() else { continue };
                let Ok(mut m) = rmp_serde::from_slice::<RouterMsg>(&body) else { continue };
                match m.ty.as_str() {
                    "challenge" => {
                        let (Some(secret), Some(router)) = (&opts.secret, Nonce::from_hex(&m.nonce)) else { continue };
                        let nonces = HandshakeNonces { worker: our_nonce, router };
                        // Like the real worker: nothing goes to a router that did not prove the secret.
                        if !secret.verify_router_proof(&nonces, id, &m.proof) { continue }
                        let mut proven = register.clone();
                        proven["auth"] = secret.worker_proof(&nonces, id, &opts.model).into();
                        let _ = sock.send(encode(&proven)).await;
                    }
                    "registered" => {
                        registered = true;
                        stats.registered.fetch_add(1, Ordering::Relaxed);
                    }
                    "generate" => {
                        stats.generates.fetch_add(1, Ordering::Relaxed);
                        *stats.last_generate.lock().unwrap() =
                            Some((std::mem::take(&mut m.tier), std::mem::take(&mut m.class), m.decode_target));
                        let sampling = m.sampling.take().unwrap_or_default();
                        *stats.last_input.lock().unwrap() = Some((m.input_ids.clone(), sampling.max_tokens));
                        *stats.last_grammar.lock().unwrap() = m.grammar.take();
                        let n = m.input_ids.len() as u64;
                        stats.prompt_tokens.fetch_add(n, Ordering::Relaxed);
                        stats.half_prompt_tokens.fetch_add(n / 2, Ordering::Relaxed);
                        let (out, finish) = plan_output(&m.input_ids, &sampling);
                        if opts.step_delay.is_zero() {
                            for msg in chunks(id, &m.request_id, &out, finish, m.input_ids.len(), &opts) {
                                let _ = sock.send(msg).await;
                            }
                        } else {
                            tokio::spawn(paced(id, m, out, finish, opts.clone(), aborted.clone(), paced_tx.clone()));
                        }
                    }
                    "abort" => {
                        stats.aborts.fetch_add(1, Ordering::Relaxed);
                        aborted.lock().unwrap().insert(m.request_id);
                    }
                    "reconfigure" => {
                        stats.reconfigures.fetch_add(1, Ordering::Relaxed);
                        let mine = m.groups.iter().find(|g| g.members.contains(&id.device()));
                        let tp = mine.map_or(0, |g| g.tp);
                        *stats.last_reconfigure.lock().unwrap() =
                            Some((m.epoch, tp, mine.and_then(|g| g.max_batch)));
                        if opts.ignore_reconfigure {
                            continue;
                        }
                        let refuse = opts.refuse_tp_above.is_some_and(|max| tp > max);
                        let error = refuse.then(|| format!("mock worker {id} cannot run TP {tp}"));
                        if refuse {
                            stats.refused.fetch_add(1, Ordering::Relaxed);
                        }
                        let ack = serde_json::json!({"v": PROTOCOL_VERSION, "type": "reconfigured",
                            "worker_id": id, "epoch": m.epoch, "ok": !refuse, "error": error,
                            "timings_ms": {"total": 0.0}});
                        let _ = sock.send(encode(&ack)).await;
                    }
                    "shutdown" => return,
                    _ => {}
                }
            }
            Some(msg) = paced_rx.recv() => { let _ = sock.send(msg).await; }
            _ = beat.tick() => {
                ticks += 1;
                let hb = serde_json::json!({"v": PROTOCOL_VERSION, "type": "heartbeat", "worker_id": id,
                    "running": 0, "waiting": 0, "free_pages": 1000, "epoch": 0});
                let _ = sock.send(encode(&hb)).await;
                if opts.report_stats && registered {
                    let mut s = serde_json::json!({"v": PROTOCOL_VERSION, "type": "stats", "worker_id": id,
                        "prefix_cache_queries": stats.prompt_tokens.load(Ordering::Relaxed),
                        "prefix_cache_hits": stats.half_prompt_tokens.load(Ordering::Relaxed),
                        "num_preemptions": stats.generates.load(Ordering::Relaxed),
                        "kv_cache_usage_perc": 25});
                    if let Some(map) = s.as_object_mut() {
                        map.extend(opts.stats_extra.clone());
                    }
                    let _ = sock.send(encode(&s)).await;
                }
                // Re-register until acknowledged (the router may have started after us).
                if !registered && ticks.is_multiple_of(4) {
                    our_nonce = Nonce::random();
                    let _ = sock.send(opening(&our_nonce)).await;
                }
            }
        }
    }
}

fn chunks(
    id: WorkerId,
    rid: &str,
    out: &[u32],
    finish: &str,
    prompt: usize,
    opts: &MockOptions,
) -> Vec<ZmqMessage> {
    let per = opts.tokens_per_message;
    let per = if per == 0 { out.len().max(1) } else { per };
    let parts: Vec<&[u32]> = if out.is_empty() {
        vec![&[][..]]
    } else {
        out.chunks(per).collect()
    };
    let n = parts.len();
    parts
        .into_iter()
        .enumerate()
        .map(|(i, ids)| {
            encode(&Tokens {
                v: PROTOCOL_VERSION,
                ty: "tokens",
                worker_id: id,
                request_id: rid,
                token_ids: ids,
                finish_reason: (i + 1 == n).then_some(finish),
                error: None,
                prompt_tokens: prompt,
                queue_ms: opts.queue_ms.filter(|_| i == 0),
            })
        })
        .collect()
}

async fn paced(
    id: WorkerId,
    m: RouterMsg,
    out: Vec<u32>,
    finish: &'static str,
    opts: MockOptions,
    aborted: Arc<Mutex<HashSet<String>>>,
    tx: mpsc::UnboundedSender<ZmqMessage>,
) {
    for msg in chunks(id, &m.request_id, &out, finish, m.input_ids.len(), &opts) {
        tokio::time::sleep(opts.step_delay).await;
        if aborted.lock().unwrap().remove(&m.request_id) {
            let ack = Tokens {
                v: PROTOCOL_VERSION,
                ty: "tokens",
                worker_id: id,
                request_id: &m.request_id,
                token_ids: &[],
                finish_reason: Some("abort"),
                error: None,
                prompt_tokens: m.input_ids.len(),
                queue_ms: None,
            };
            let _ = tx.send(encode(&ack));
            return;
        }
        let _ = tx.send(msg);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_echoes_prompt_and_stops_on_stop_token() {
        let s = Sampling {
            max_tokens: 5,
            ..Sampling::default()
        };
        assert_eq!(plan_output(&[7, 8], &s), (vec![7, 8, 7, 8, 7], "length"));
        let s = Sampling {
            max_tokens: 5,
            stop_token_ids: vec![8],
            ..Sampling::default()
        };
        assert_eq!(plan_output(&[7, 8], &s), (vec![7, 8], "stop"));
        let s = Sampling {
            ignore_eos: true,
            ..s
        };
        assert_eq!(plan_output(&[7, 8], &s).1, "length");
    }
}
