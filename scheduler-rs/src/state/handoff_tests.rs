//! P/D across host worker processes on the router side: a decode target that streams becomes
//! the request's only worker, and a re-dispatch after a death tells the surviving side to
//! drop the request.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use super::tests::{drain_raw, msg, register, submit, tokens};
use super::{Event, FinishReason, RouterState};
use crate::config::RouterConfig;
use crate::ids::WorkerId;
use crate::plan::{GroupPlan, Role};

fn group(member: u32, role: Role, tier: &str) -> GroupPlan {
    GroupPlan {
        members: vec![member],
        tp: 1,
        pp: 1,
        role,
        tiers: vec![RouterConfig::default()
            .tier_index(tier)
            .expect("a default tier")],
        accepts_background: true,
        max_rps: 0.0,
        max_inflight: 0.0,
    }
}

#[tokio::test]
async fn the_decode_host_takes_over_and_a_dead_prefill_host_loses_nothing() {
    // Prefill on worker 0, decode on worker 1 (strict), a mixed worker 2 (relaxed only).
    let cfg = RouterConfig {
        heartbeat_timeout_ms: 100,
        worker_gone_ms: 100,
        static_plan: Some(vec![
            group(0, Role::Prefill, "strict"),
            group(1, Role::Decode, "strict"),
            group(2, Role::Mixed, "relaxed"),
        ]),
        ..RouterConfig::default()
    };
    let (engine, mut rx) = RouterState::new(Arc::new(cfg));
    for w in 0..3 {
        register(&engine, w);
    }
    drain_raw(&mut rx);
    let mut handed = engine.submit(submit()).unwrap();
    let mut mid_transfer = engine.submit(submit()).unwrap();
    let sent = drain_raw(&mut rx);
    for h in [&handed, &mid_transfer] {
        let g = sent
            .iter()
            .find(|(_, v)| v["request_id"] == engine.wire_id(h.id()).as_str())
            .unwrap();
        assert_eq!(
            (g.0.as_str(), &g.1["routing"]["decode_target"]),
            ("0", &json!(1))
        );
    }
    // Process 1 adopted the first request and streams it (its first token included).
    tokens(&engine, 1, handed.id(), &[5], None);
    // Process 0 dies with the second one's KV still on its way.
    std::thread::sleep(Duration::from_millis(120));
    for w in [1, 2] {
        msg(
            &engine,
            w,
            json!({"v": 1, "type": "heartbeat", "worker_id": w}),
        );
    }
    assert_eq!(engine.reap_dead(Instant::now()), [WorkerId(0)]);
    let after: Vec<(String, String, String)> = drain_raw(&mut rx)
        .into_iter()
        .filter(|(_, v)| v["type"] == "generate" || v["type"] == "abort")
        .map(|(to, v)| {
            let rid = v["request_id"].as_str().unwrap_or_default().to_string();
            (to, v["type"].as_str().unwrap().to_string(), rid)
        })
        .collect();
    // Only the second request runs again, on the surviving mixed worker; the decode side,
    // which may hold a half-received copy, is told to drop it. The first is left alone.
    let second = engine.wire_id(mid_transfer.id());
    assert_eq!(
        after,
        [
            ("1".into(), "abort".into(), second.clone()),
            ("2".into(), "generate".into(), second),
        ]
    );
    tokens(&engine, 1, handed.id(), &[6], Some("length"));
    tokens(&engine, 2, mid_transfer.id(), &[7], Some("length"));
    let all = |ids: Vec<u32>| Event::Tokens {
        ids,
        finish: Some(FinishReason::Length),
        logprobs: None,
    };
    assert_eq!(
        handed.recv().await,
        Some(Event::Tokens {
            ids: vec![5],
            finish: None,
            logprobs: None
        })
    );
    assert_eq!(handed.recv().await, Some(all(vec![6])));
    assert_eq!(mid_transfer.recv().await, Some(all(vec![7])));
    assert_eq!(engine.inflight(), 0);
}
