//! The sealed channel in the router state: after the handshake nothing crosses in clear, and a
//! forged, modified, replayed, dropped or clear-injected frame closes the channel, acts on
//! nothing, and puts the worker out of the plan until it authenticates again.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::plane_peer::{drain_frames, drain_raw, handshake, seal, send, send_raw, Rx};
use super::tests::submit;
use super::{Event, FinishReason, RequestHandle, RouterState};
use crate::config::RouterConfig;
use crate::worker_auth::{Rejection, WorkerSecret};

fn engine() -> (Arc<RouterState>, Rx) {
    let secret = WorkerSecret::new("sealed-tests-secret-0123").unwrap();
    RouterState::new(Arc::new(RouterConfig {
        worker_secret: Some(secret),
        ..RouterConfig::default()
    }))
}

fn join(engine: &RouterState, rx: &mut Rx) {
    let secret = engine.cfg.worker_secret.clone().unwrap();
    assert_eq!(
        handshake(engine, rx, "a", 0, "nitsum", &secret),
        "registered"
    );
}

/// A request on worker 0 and its wire id; every frame to the worker was sealed.
fn generate(engine: &Arc<RouterState>, rx: &mut Rx) -> (RequestHandle, String) {
    let h = engine.submit(submit()).unwrap();
    let sent = drain_frames(rx);
    let (_, raw, m) = sent
        .iter()
        .find(|(_, _, m)| m["type"] == "generate")
        .unwrap();
    assert_eq!(raw[0], 0xc1, "sealed");
    assert!(!raw.windows(8).any(|w| w == b"generate"));
    assert!(!raw.windows(9).any(|w| w == b"input_ids"));
    (h, m["request_id"].as_str().unwrap().to_string())
}

fn tokens(rid: &str, ids: &[u32], finish: Option<&str>) -> Value {
    json!({"v": 1, "type": "tokens", "worker_id": 0, "request_id": rid, "token_ids": ids,
        "finish_reason": finish})
}

async fn nothing_for(h: &mut RequestHandle) {
    let got = tokio::time::timeout(Duration::from_millis(50), h.recv()).await;
    assert!(got.is_err(), "the client got {got:?}");
}

/// The channel was closed: counted, worker 0 out of the plan, told to authenticate again.
fn closed(engine: &RouterState, rx: &mut Rx, times: u64) {
    assert_eq!(engine.metrics.plane.get(Rejection::BadFrame), times);
    assert!(engine.workers().is_empty(), "out of the plan");
    let sent = drain_raw(rx);
    assert!(
        sent.iter()
            .any(|(to, m)| to == "a" && m["type"] == "reregister"),
        "{sent:?}"
    );
}

#[tokio::test]
async fn sealed_tokens_finish_a_request() {
    let (engine, mut rx) = engine();
    join(&engine, &mut rx);
    let (mut h, rid) = generate(&engine, &mut rx);
    send(&engine, "a", tokens(&rid, &[5], Some("length")));
    let want = Event::Tokens {
        ids: vec![5],
        finish: Some(FinishReason::Length),
        logprobs: None,
    };
    assert_eq!(h.recv().await, Some(want));
    assert_eq!(engine.metrics.plane.get(Rejection::BadFrame), 0);
}

#[tokio::test]
async fn every_attack_closes_the_channel_and_forges_nothing() {
    let (engine, mut rx) = engine();
    type Attack = fn(&RouterState, &str);
    let attacks: [(&str, Attack); 5] = [
        ("clear injection", |e, rid| {
            let clear = rmp_serde::to_vec_named(&tokens(rid, &[66], Some("stop"))).unwrap();
            send_raw(e, "a", &clear);
        }),
        ("modified", |e, rid| {
            let mut f = seal("a", &tokens(rid, &[66], Some("stop")));
            let n = f.len();
            f[n - 20] ^= 1;
            send_raw(e, "a", &f);
        }),
        ("replayed", |e, rid| {
            let f = seal("a", &tokens(rid, &[7], None));
            send_raw(e, "a", &f);
            send_raw(e, "a", &f);
        }),
        ("dropped", |e, rid| {
            let _lost = seal("a", &tokens(rid, &[7], None));
            send_raw(e, "a", &seal("a", &tokens(rid, &[66], Some("stop"))));
        }),
        ("forged", |e, _| {
            let mut f = vec![0xc1; 9];
            f.extend_from_slice(&[0u8; 40]);
            send_raw(e, "a", &f);
        }),
    ];
    for (i, (name, attack)) in attacks.into_iter().enumerate() {
        join(&engine, &mut rx);
        let (mut h, rid) = generate(&engine, &mut rx);
        attack(&engine, &rid);
        // The replay's first copy was genuine: its token went through, nothing after it.
        if name == "replayed" {
            let got = h.recv().await;
            assert!(
                matches!(got, Some(Event::Tokens { ref ids, .. }) if ids == &[7]),
                "{got:?}"
            );
        }
        nothing_for(&mut h).await;
        closed(&engine, &mut rx, i as u64 + 1);
        // Frames sealed for the closed channel are not heard; the worker is told again.
        send(&engine, "a", tokens(&rid, &[66], Some("stop")));
        nothing_for(&mut h).await;
        drop(h);
    }
}

#[test]
fn a_new_hello_ends_the_old_channel() {
    let (engine, mut rx) = engine();
    join(&engine, &mut rx);
    join(&engine, &mut rx);
    assert_eq!(engine.workers().len(), 1);
    // The old channel's keys are gone: the new one starts at seq 0 with new keys.
    let (_h, rid) = generate(&engine, &mut rx);
    send(&engine, "a", tokens(&rid, &[5], None));
    assert_eq!(engine.metrics.plane.get(Rejection::BadFrame), 0);
}
