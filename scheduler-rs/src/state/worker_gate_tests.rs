//! The worker-plane gate without a network: handshake, id binding, model check, and tokens
//! accepted only from the connection serving the request (docs/security.md).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use super::plane_peer::{self, drain_raw, handshake, hello_msg, register_msg, send, Rx};
use super::tests::submit;
use super::{Event, RouterState};
use crate::config::RouterConfig;
use crate::ids::WorkerId;
use crate::worker_auth::{HandshakeNonces, Nonce, Rejection, WorkerSecret};

fn secret() -> WorkerSecret {
    WorkerSecret::new("handshake-tests-secret-0123").unwrap()
}

fn engine() -> (Arc<RouterState>, Rx) {
    RouterState::new(Arc::new(RouterConfig {
        worker_secret: Some(secret()),
        heartbeat_timeout_ms: 100,
        worker_gone_ms: 100,
        ..RouterConfig::default()
    }))
}

fn hello(engine: &RouterState, rx: &mut Rx, conn: &str, worker: u32) -> HandshakeNonces {
    plane_peer::hello(engine, rx, conn, worker, &secret()).nonces
}

fn rejected(engine: &RouterState, why: Rejection) -> u64 {
    engine.metrics.plane.get(why)
}

#[test]
fn only_the_handshake_is_heard_before_authentication() {
    let (engine, mut rx) = engine();
    send(
        &engine,
        "a",
        json!({"v": 1, "type": "heartbeat", "worker_id": 0}),
    );
    send(
        &engine,
        "a",
        json!({"v": 1, "type": "stats", "worker_id": 0, "x": 1.0}),
    );
    assert_eq!(rejected(&engine, Rejection::Unauthenticated), 2);
    // The heartbeat is answered by `reregister` (how a worker learns the router restarted).
    let sent = drain_raw(&mut rx);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].1["type"], "reregister");
    // A register with a proof but no challenge issued to this connection is refused.
    send(
        &engine,
        "a",
        register_msg(0, "nitsum", Some("00".repeat(32))),
    );
    assert_eq!(rejected(&engine, Rejection::BadProof), 1);
    assert!(engine.workers().is_empty());
    assert_eq!(
        handshake(&engine, &mut rx, "a", 0, "nitsum", &secret()),
        "registered"
    );
    assert_eq!(engine.workers().len(), 1);
}

#[test]
fn bad_proofs_and_wrong_models_are_refused() {
    let (engine, mut rx) = engine();
    let wrong = WorkerSecret::new("not-the-router-secret-0000").unwrap();
    assert_eq!(
        handshake(&engine, &mut rx, "a", 0, "nitsum", &wrong),
        "refused"
    );
    assert_eq!(rejected(&engine, Rejection::BadProof), 1);
    assert_eq!(
        handshake(&engine, &mut rx, "a", 0, "other", &secret()),
        "refused"
    );
    assert_eq!(rejected(&engine, Rejection::WrongModel), 1);
    // A challenge answered once cannot be answered again (replay).
    let nonces = hello(&engine, &mut rx, "b", 1);
    let proof = secret().worker_proof(&nonces, WorkerId(1), "nitsum");
    send(&engine, "b", register_msg(1, "nitsum", Some(proof.clone())));
    send(&engine, "c", register_msg(1, "nitsum", Some(proof)));
    assert_eq!(
        rejected(&engine, Rejection::BadProof),
        2,
        "replayed on another connection"
    );
    assert_eq!(engine.workers().len(), 1);
}

#[test]
fn the_challenge_proves_the_router_secret_over_both_nonces() {
    let (engine, mut rx) = engine();
    let ours = Nonce::random();
    send(&engine, "a", hello_msg(4, &ours));
    let sent = drain_raw(&mut rx);
    let challenge = &sent[0].1;
    let proof = challenge["proof"].as_str().unwrap();
    let router = Nonce::from_hex(challenge["nonce"].as_str().unwrap()).unwrap();
    assert_ne!(router, ours);
    let nonces = HandshakeNonces {
        worker: ours,
        router,
    };
    assert!(secret().verify_router_proof(&nonces, WorkerId(4), proof));
    // Not for another worker nonce (a relay's own `hello`), id or secret.
    let relayed = HandshakeNonces {
        worker: Nonce::random(),
        router,
    };
    assert!(!secret().verify_router_proof(&relayed, WorkerId(4), proof));
    assert!(!secret().verify_router_proof(&nonces, WorkerId(5), proof));
    let wrong = WorkerSecret::new("not-the-router-secret-0000").unwrap();
    assert!(!wrong.verify_router_proof(&nonces, WorkerId(4), proof));
    // The router's proof is no worker proof: sent back as `auth` it is refused.
    send(
        &engine,
        "a",
        register_msg(4, "nitsum", Some(proof.to_string())),
    );
    assert_eq!(rejected(&engine, Rejection::BadProof), 1);
    assert!(engine.workers().is_empty());
}

#[test]
fn a_register_answers_only_the_challenge_of_its_own_hello() {
    let (engine, mut rx) = engine();
    // Without `auth` (the old handshake opened with a bare register): refused, not challenged.
    send(&engine, "a", register_msg(2, "nitsum", None));
    let sent = drain_raw(&mut rx);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].1["type"], "refused");
    assert!(sent[0].1["error"].as_str().unwrap().contains("hello"));
    // A proof over the router nonce but another worker nonce than the hello's.
    let nonces = hello(&engine, &mut rx, "a", 2);
    let other = HandshakeNonces {
        worker: Nonce::random(),
        ..nonces
    };
    let auth = secret().worker_proof(&other, WorkerId(2), "nitsum");
    send(&engine, "a", register_msg(2, "nitsum", Some(auth)));
    // A valid proof for another id than the one the hello named.
    let nonces = hello(&engine, &mut rx, "a", 2);
    let auth = secret().worker_proof(&nonces, WorkerId(3), "nitsum");
    send(&engine, "a", register_msg(3, "nitsum", Some(auth)));
    assert_eq!(rejected(&engine, Rejection::BadProof), 3);
    assert!(engine.workers().is_empty());
}

#[test]
fn a_hello_the_router_cannot_answer_is_refused() {
    let (engine, mut rx) = engine();
    let nonce = Nonce::random().to_hex();
    for bad in [
        json!({"v": 1, "type": "hello", "worker_id": 0, "handshake": 1, "nonce": nonce}),
        json!({"v": 1, "type": "hello", "worker_id": 0, "nonce": nonce}),
        json!({"v": 1, "type": "hello", "worker_id": 0, "handshake": 3}),
        json!({"v": 1, "type": "hello", "worker_id": 0, "handshake": 3, "nonce": "abcd"}),
        // A worker of handshake 2 (no sealed frames) is refused by name.
        json!({"v": 1, "type": "hello", "worker_id": 0, "handshake": 2, "nonce": nonce}),
    ] {
        send(&engine, "a", bad);
    }
    let sent = drain_raw(&mut rx);
    let types: Vec<_> = sent.iter().map(|(_, m)| m["type"].clone()).collect();
    assert_eq!(types, vec!["refused"; 5]);
    assert!(sent[0].1["error"]
        .as_str()
        .unwrap()
        .contains("handshake version Some(1)"));
    let old = sent[4].1["error"].as_str().unwrap();
    assert!(
        old.contains("handshake version Some(2) is not supported; this router speaks 3"),
        "{old}"
    );
    assert_eq!(rejected(&engine, Rejection::Handshake), 5);
    // A router without a secret cannot prove one: it refuses `hello` too.
    let (open, mut rx) = RouterState::new(Arc::new(RouterConfig::default()));
    send(&open, "a", hello_msg(0, &Nonce::random()));
    let sent = drain_raw(&mut rx);
    assert_eq!(sent[0].1["type"], "refused");
    assert!(sent[0].1["error"].as_str().unwrap().contains("insecure"));
}

#[test]
fn a_live_id_stays_with_its_connection() {
    let (engine, mut rx) = engine();
    assert_eq!(
        handshake(&engine, &mut rx, "a", 0, "nitsum", &secret()),
        "registered"
    );
    // Another connection, even one that knows the secret, cannot take worker 0.
    assert_eq!(
        handshake(&engine, &mut rx, "b", 0, "nitsum", &secret()),
        "refused"
    );
    assert_eq!(rejected(&engine, Rejection::IdTaken), 1);
    // Nor can the first connection serve a second id.
    assert_eq!(
        handshake(&engine, &mut rx, "a", 1, "nitsum", &secret()),
        "refused"
    );
    assert_eq!(rejected(&engine, Rejection::ConnectionBound), 1);
    // NOTE: that `hello` ended a's channel (a worker says `hello` only once it dropped its
    // own): worker 0 authenticates on it again.
    assert_eq!(
        handshake(&engine, &mut rx, "a", 0, "nitsum", &secret()),
        "registered"
    );
    let _h = engine.submit(submit()).unwrap();
    let sent = drain_raw(&mut rx);
    assert!(sent
        .iter()
        .any(|(to, m)| to == "a" && m["type"] == "generate"));
    // Once worker 0 is dead, a new connection (a restarted worker) may take the id.
    assert_eq!(
        engine.reap_dead(Instant::now() + Duration::from_secs(1)),
        vec![WorkerId(0)]
    );
    assert_eq!(
        handshake(&engine, &mut rx, "b", 0, "nitsum", &secret()),
        "registered"
    );
    send(
        &engine,
        "a",
        json!({"v": 1, "type": "heartbeat", "worker_id": 0}),
    );
    assert_eq!(
        rejected(&engine, Rejection::Unauthenticated),
        1,
        "a was unbound"
    );
}

#[tokio::test]
async fn tokens_count_only_from_the_connection_serving_the_request() {
    let (engine, mut rx) = engine();
    assert_eq!(
        handshake(&engine, &mut rx, "a", 0, "nitsum", &secret()),
        "registered"
    );
    assert_eq!(
        handshake(&engine, &mut rx, "b", 1, "nitsum", &secret()),
        "registered"
    );
    let mut h = engine.submit(submit()).unwrap();
    let sent = drain_raw(&mut rx);
    let (to, generate) = sent.iter().find(|(_, m)| m["type"] == "generate").unwrap();
    let rid = generate["request_id"].as_str().unwrap().to_string();
    assert_eq!(rid, engine.wire_id(h.id()));
    assert_eq!(rid.len(), 32);
    let (serving, serving_id, other, other_id) = if to == "a" {
        ("a", 0, "b", 1)
    } else {
        ("b", 1, "a", 0)
    };
    let tokens = |w: u32, r: &str| json!({"v": 1, "type": "tokens", "worker_id": w, "request_id": r, "token_ids": [66], "finish_reason": "stop"});
    send(&engine, other, tokens(serving_id, &rid)); // naming the serving worker
    assert_eq!(rejected(&engine, Rejection::WrongWorker), 1);
    send(&engine, other, tokens(other_id, &rid)); // as itself
    assert_eq!(rejected(&engine, Rejection::ForeignRequest), 1);
    send(&engine, serving, tokens(serving_id, &h.id().to_string())); // the bare counter
    assert_eq!(rejected(&engine, Rejection::UnknownRequest), 1);
    assert_eq!(engine.inflight(), 1);
    send(
        &engine,
        serving,
        json!({"v": 1, "type": "tokens", "worker_id": serving_id,
        "request_id": rid, "token_ids": [5], "finish_reason": "length"}),
    );
    assert_eq!(
        h.recv().await,
        Some(Event::Tokens {
            ids: vec![5],
            finish: Some(super::FinishReason::Length),
            logprobs: None
        })
    );
}
