//! One mock worker's connection: the handshake (`hello`/`register`), then answering the
//! router's messages (`generate`, `abort`, `reconfigure`, `shutdown`) and sending heartbeats
//! and stats until it ends.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use serde::Deserialize;
use tokio::sync::mpsc;
use zeromq::{DealerSocket, SocketRecv, ZmqMessage};

use super::echo_output::{chunks, encode, plan_output, Tokens};
use super::sealed::MockLink;
use super::{MockOptions, MockStats};
use crate::ids::WorkerId;
use crate::protocols::worker::{Stop, PROTOCOL_VERSION};
use crate::worker_auth::{HandshakeNonces, Nonce, HANDSHAKE_VERSION};

/// Router → worker message, decoded flat (fields of all types optional).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RouterMsg {
    #[serde(rename = "type")]
    ty: String,
    request_id: String,
    input_ids: Vec<u32>,
    stop: Option<Stop>,
    epoch: u64,
    contract: MockContract,
    nonce: String,
    proof: String,
    routing: MockRouting,
    groups: Vec<MockGroup>,
    grammar: Option<crate::protocols::structured::Grammar>,
}

/// A `generate`'s `contract` as the mock reads it.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct MockContract {
    tier: String,
    class: String,
}

/// A `generate`'s `routing` as the mock reads it.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct MockRouting {
    decode_target: Option<WorkerId>,
}

/// A `reconfigure` group as the mock reads it.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct MockGroup {
    members: Vec<u32>,
    tp: u32,
    max_batch: Option<u32>,
}
pub(super) async fn run(
    sock: DealerSocket,
    id: WorkerId,
    opts: MockOptions,
    stats: Arc<MockStats>,
) {
    let mut register = serde_json::json!({"v": PROTOCOL_VERSION, "type": "register", "worker_id": id,
        "device": "mock", "model": opts.model, "tp_levels": opts.tp_levels, "kv_capacity_tokens": 1u64 << 20,
        "max_context": opts.max_context, "eos_token_ids": opts.eos_token_ids});
    if let Some(domain) = opts.domain {
        register["domain"] = domain.into();
    }
    // With a secret, `hello` (a fresh nonce each time) opens the handshake; else `register`.
    let mut link = MockLink::new(sock);
    let mut our_nonce = Nonce::random();
    let opening = |nonce: &Nonce| match &opts.secret {
        Some(_) => rmp_serde::to_vec_named(&serde_json::json!({"v": PROTOCOL_VERSION,
            "type": "hello", "worker_id": id, "handshake": HANDSHAKE_VERSION,
            "nonce": nonce.to_hex()}))
        .expect("msgpack"),
        None => rmp_serde::to_vec_named(&register).expect("msgpack"),
    };
    link.hello(opening(&our_nonce)).await;
    let mut beat = tokio::time::interval(opts.heartbeat);
    let mut registered = false;
    let mut ticks = 0u64;
    let aborted: Arc<Mutex<HashSet<String>>> = Arc::default();
    let (paced_tx, mut paced_rx) = mpsc::unbounded_channel::<ZmqMessage>();
    loop {
        tokio::select! {
            msg = link.sock.recv() => {
                let Ok(msg) = msg else { continue };
                let Some(frame) = msg.into_vec().pop() else { continue };
                let Some(body) = link.open(&frame) else { continue };
                let Ok(mut m) = rmp_serde::from_slice::<RouterMsg>(&body) else { continue };
                match m.ty.as_str() {
                    "challenge" => {
                        let (Some(secret), Some(router)) = (&opts.secret, Nonce::from_hex(&m.nonce)) else { continue };
                        let nonces = HandshakeNonces { worker: our_nonce, router };
                        // Like the real worker: nothing goes to a router that did not prove the secret.
                        if !secret.verify_router_proof(&nonces, id, &m.proof) { continue }
                        let mut proven = register.clone();
                        proven["auth"] = secret.worker_proof(&nonces, id, &opts.model).into();
                        let proven = rmp_serde::to_vec_named(&proven).expect("msgpack");
                        link.register(secret, &nonces, &body, proven).await;
                    }
                    "registered" => {
                        registered = true;
                        stats.registered.fetch_add(1, Ordering::Relaxed);
                    }
                    "generate" => {
                        stats.generates.fetch_add(1, Ordering::Relaxed);
                        *stats.last_generate.lock().unwrap() =
                            Some((std::mem::take(&mut m.contract.tier), std::mem::take(&mut m.contract.class), m.routing.decode_target));
                        let stop = m.stop.take().unwrap_or_default();
                        *stats.last_input.lock().unwrap() = Some((m.input_ids.clone(), stop.max_tokens));
                        *stats.last_grammar.lock().unwrap() = m.grammar.take();
                        let n = m.input_ids.len() as u64;
                        stats.prompt_tokens.fetch_add(n, Ordering::Relaxed);
                        stats.half_prompt_tokens.fetch_add(n / 2, Ordering::Relaxed);
                        let (out, finish) = plan_output(&m.input_ids, &stop);
                        if opts.step_delay.is_zero() {
                            for msg in chunks(id, &m.request_id, &out, finish, m.input_ids.len(), &opts) {
                                link.send(msg).await;
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
                        link.send(encode(&ack)).await;
                    }
                    // The router lost our channel (or restarted): authenticate again.
                    "reregister" => registered = false,
                    "shutdown" => return,
                    _ => {}
                }
            }
            Some(msg) = paced_rx.recv() => { link.send(msg).await; }
            _ = beat.tick() => {
                ticks += 1;
                let hb = serde_json::json!({"v": PROTOCOL_VERSION, "type": "heartbeat", "worker_id": id,
                    "running": 0, "waiting": 0, "free_pages": 1000, "epoch": 0});
                link.send(encode(&hb)).await;
                if opts.report_stats && registered {
                    let mut s = serde_json::json!({"v": PROTOCOL_VERSION, "type": "stats", "worker_id": id,
                        "prefix_cache_queries": stats.prompt_tokens.load(Ordering::Relaxed),
                        "prefix_cache_hits": stats.half_prompt_tokens.load(Ordering::Relaxed),
                        "num_preemptions": stats.generates.load(Ordering::Relaxed),
                        "kv_cache_usage_perc": 25});
                    if let Some(map) = s.as_object_mut() {
                        map.extend(opts.stats_extra.clone());
                    }
                    link.send(encode(&s)).await;
                }
                // Re-register until acknowledged (the router may have started after us).
                if !registered && ticks.is_multiple_of(4) {
                    our_nonce = Nonce::random();
                    link.hello(opening(&our_nonce)).await;
                }
            }
        }
    }
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
