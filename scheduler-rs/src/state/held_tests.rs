//! Slow is not gone: a suspect worker keeps its requests and gets no new work; a gone one's
//! requests are held while no worker is live and resume on the first one that is; what a
//! stale worker streams for a held or moved request is dropped; the retry window bounds it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use super::tests::{drain_raw, msg, register, submit, tokens};
use super::{Event, FinishReason, RequestHandle, RouterState};
use crate::config::RouterConfig;
use crate::ids::WorkerId;

fn engine(
    suspect_ms: u64,
    gone_ms: u64,
    retry_ms: u64,
) -> (
    Arc<RouterState>,
    tokio::sync::mpsc::UnboundedReceiver<super::Outbound>,
) {
    RouterState::new(Arc::new(RouterConfig {
        heartbeat_timeout_ms: suspect_ms,
        worker_gone_ms: gone_ms,
        retry_window_ms: retry_ms,
        ..RouterConfig::default()
    }))
}

fn heartbeat(engine: &RouterState, worker: u32) {
    msg(
        engine,
        worker,
        json!({"v": 1, "type": "heartbeat", "worker_id": worker}),
    );
}

fn chunk(ids: &[u32], finish: Option<FinishReason>) -> Option<Event> {
    Some(Event::Tokens {
        ids: ids.to_vec(),
        finish,
        logprobs: None,
    })
}

/// Whether the handle has nothing to deliver yet (its request is neither ended nor failed).
async fn quiet(h: &mut RequestHandle) -> bool {
    tokio::time::timeout(Duration::from_millis(30), h.recv())
        .await
        .is_err()
}

/// (to, input_ids) of every `generate` sent.
fn generates(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<super::Outbound>,
) -> Vec<(String, serde_json::Value)> {
    drain_raw(rx)
        .into_iter()
        .filter(|(_, v)| v["type"] == "generate")
        .map(|(to, v)| (to, v["input_ids"].clone()))
        .collect()
}

#[tokio::test]
async fn a_suspect_worker_keeps_its_requests_gets_no_new_work_and_comes_back() {
    let (engine, mut rx) = engine(100, 60_000, 60_000);
    register(&engine, 0);
    let mut a = engine.submit(submit()).unwrap();
    register(&engine, 1);
    tokens(&engine, 0, a.id(), &[3], None);
    assert_eq!(a.recv().await, chunk(&[3], None));
    drain_raw(&mut rx);
    std::thread::sleep(Duration::from_millis(120));
    heartbeat(&engine, 1);
    // Worker 0 is silent past the heartbeat timeout: suspect, not gone.
    assert!(engine.reap_dead(Instant::now()).is_empty());
    assert_eq!(
        engine.workers().iter().map(|w| w.0).collect::<Vec<_>>(),
        [WorkerId(1)]
    );
    // Its request stays with it: nothing was resent, nothing failed.
    assert!(generates(&mut rx).is_empty());
    assert!(quiet(&mut a).await);
    // New work goes to the live worker only.
    let b = engine.submit(submit()).unwrap();
    assert_eq!(generates(&mut rx), [("1".to_string(), json!([1, 2]))]);
    // The slow worker answers again: live, and its request completes where it ran.
    heartbeat(&engine, 0);
    assert_eq!(engine.workers().len(), 2);
    tokens(&engine, 0, a.id(), &[4], Some("length"));
    assert_eq!(a.recv().await, chunk(&[4], Some(FinishReason::Length)));
    tokens(&engine, 1, b.id(), &[7], Some("stop"));
    assert_eq!(engine.inflight(), 0);
}

#[tokio::test]
async fn with_no_live_worker_requests_are_held_and_resume_on_a_replacement() {
    let (engine, mut rx) = engine(100, 1000, 60_000);
    register(&engine, 0);
    let mut streamed = engine.submit(submit()).unwrap();
    let mut waiting = engine.submit(submit()).unwrap();
    tokens(&engine, 0, streamed.id(), &[3], None);
    assert_eq!(streamed.recv().await, chunk(&[3], None));
    drain_raw(&mut rx);
    // Suspect: a new request is held, not refused (503).
    assert!(engine
        .reap_dead(Instant::now() + Duration::from_millis(150))
        .is_empty());
    let mut new = engine.submit(submit()).unwrap();
    // Gone, and no other worker: its requests are held, not failed.
    let later = Instant::now() + Duration::from_millis(1300);
    assert_eq!(engine.reap_dead(later), [WorkerId(0)]);
    for h in [&mut streamed, &mut waiting, &mut new] {
        assert!(quiet(h).await);
    }
    assert_eq!(engine.inflight(), 3);
    assert!(generates(&mut rx).is_empty());
    // A replacement registers: all three resume on it, the streamed one from its token.
    register(&engine, 0);
    let mut sent = generates(&mut rx);
    sent.sort_by_key(|(_, ids)| ids.as_array().map_or(0, Vec::len));
    assert_eq!(
        sent,
        [
            ("0".to_string(), json!([1, 2])),
            ("0".to_string(), json!([1, 2])),
            ("0".to_string(), json!([1, 2, 3])),
        ]
    );
    for h in [&streamed, &waiting, &new] {
        tokens(&engine, 0, h.id(), &[4], Some("length"));
    }
    for h in [&mut streamed, &mut waiting, &mut new] {
        assert_eq!(h.recv().await, chunk(&[4], Some(FinishReason::Length)));
    }
    assert_eq!(engine.inflight(), 0);
}

#[tokio::test]
async fn a_stale_worker_cannot_stream_into_a_held_or_moved_request() {
    let (engine, mut rx) = engine(100, 1000, 60_000);
    register(&engine, 0);
    let mut moved = engine.submit(submit()).unwrap();
    register(&engine, 1);
    tokens(&engine, 0, moved.id(), &[3], None);
    assert_eq!(moved.recv().await, chunk(&[3], None));
    drain_raw(&mut rx);
    // Worker 0 goes silent: suspect, then gone; its request resumes on worker 1.
    std::thread::sleep(Duration::from_millis(1100));
    heartbeat(&engine, 1);
    assert_eq!(engine.reap_dead(Instant::now()), [WorkerId(0)]);
    assert_eq!(generates(&mut rx), [("1".to_string(), json!([1, 2, 3]))]);
    // Worker 0 wakes up, rejoins, and streams what it had: dropped, never mixed in.
    register(&engine, 0);
    tokens(&engine, 0, moved.id(), &[9], None);
    tokens(&engine, 0, moved.id(), &[9], Some("length"));
    assert!(quiet(&mut moved).await);
    tokens(&engine, 1, moved.id(), &[4], Some("length"));
    assert_eq!(moved.recv().await, chunk(&[4], Some(FinishReason::Length)));

    // A request held while every worker is suspect ignores its nominal worker's tokens
    // until it is placed again.
    std::thread::sleep(Duration::from_millis(120));
    assert!(engine.reap_dead(Instant::now()).is_empty());
    assert!(engine.workers().is_empty());
    let mut held = engine.submit(submit()).unwrap();
    tokens(&engine, 0, held.id(), &[9], Some("length"));
    assert!(quiet(&mut held).await);
    drain_raw(&mut rx);
    heartbeat(&engine, 1);
    assert_eq!(generates(&mut rx), [("1".to_string(), json!([1, 2]))]);
    tokens(&engine, 1, held.id(), &[5], Some("length"));
    assert_eq!(held.recv().await, chunk(&[5], Some(FinishReason::Length)));
}

#[tokio::test]
async fn a_held_request_ends_with_an_error_after_the_retry_window() {
    let (engine, _rx) = engine(100, 100, 500);
    register(&engine, 0);
    let mut h = engine.submit(submit()).unwrap();
    let t = Instant::now() + Duration::from_millis(200);
    assert_eq!(engine.reap_dead(t), [WorkerId(0)]);
    assert!(quiet(&mut h).await);
    // Within the window (held since about now): still held; after it, an explicit error.
    engine.reap_dead(Instant::now() + Duration::from_millis(300));
    assert!(quiet(&mut h).await);
    engine.reap_dead(Instant::now() + Duration::from_millis(700));
    match h.recv().await {
        Some(Event::Error(why)) => assert!(why.contains("retry_window_ms (500 ms)"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(engine.inflight(), 0);
}
