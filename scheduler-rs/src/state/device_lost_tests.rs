//! `device_lost`: a host worker's dead device leaves the plan at once (no heartbeat timeout),
//! its requests resume on a live group from the tokens they streamed, and it comes back
//! with `register`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use serde_json::json;

use super::tests::{drain_raw, msg, register, submit, tokens};
use super::{Event, FinishReason, RouterState};
use crate::config::RouterConfig;
use crate::ids::TierId;

fn device_lost(engine: &RouterState, worker: u32) {
    msg(
        engine,
        worker,
        json!({"v": 1, "type": "device_lost", "worker_id": worker,
            "reason": "device process exited with code -9"}),
    );
}

#[tokio::test]
async fn a_lost_device_leaves_the_plan_at_once_and_its_requests_resume_elsewhere() {
    // A heartbeat timeout far beyond the test: only `device_lost` can take worker 1 out.
    let cfg = RouterConfig {
        heartbeat_timeout_ms: 600_000,
        ..RouterConfig::default()
    };
    let (engine, mut rx) = RouterState::new(Arc::new(cfg));
    register(&engine, 0);
    register(&engine, 1);
    // Two requests: the first lands on worker 0 (fewest assigned), the second on worker 1.
    let mut on_zero = engine.submit(submit()).unwrap();
    let mut on_one = engine.submit(submit()).unwrap();
    let leader_of = |rx: &mut _, id: u64| -> String {
        drain_raw(rx)
            .into_iter()
            .find(|(_, v)| v["type"] == "generate" && v["request_id"] == engine.wire_id(id))
            .map(|(to, _)| to)
            .expect("a generate")
    };
    assert_eq!(leader_of(&mut rx, on_zero.id()), "0");
    tokens(&engine, 1, on_one.id(), &[7, 8], None);
    drain_raw(&mut rx);

    device_lost(&engine, 1);
    assert!(engine.reap_dead(Instant::now()).is_empty(), "already out");
    let plan = engine.plan();
    let members: Vec<Vec<u32>> = plan.groups.iter().map(|g| g.members.clone()).collect();
    assert_eq!(members, [vec![0]]);
    // Worker 1's request resumed on worker 0 from its two tokens; worker 0's was untouched.
    let sent = drain_raw(&mut rx);
    let generates: Vec<_> = sent
        .iter()
        .filter(|(_, v)| v["type"] == "generate")
        .collect();
    assert_eq!(generates.len(), 1, "{sent:?}");
    let (to, g) = generates[0];
    assert_eq!(to, "0");
    assert_eq!(g["request_id"], engine.wire_id(on_one.id()).as_str());
    assert_eq!(g["input_ids"], json!([1, 2, 7, 8]));
    assert_eq!(g["stop"]["max_tokens"], json!(14));
    // The new plan went to the live worker (and not to the dead one).
    assert!(sent
        .iter()
        .any(|(to, v)| to == "0" && v["type"] == "reconfigure"));
    assert!(!sent.iter().any(|(to, _)| to == "1"), "{sent:?}");
    // A second report (a late duplicate) changes nothing.
    device_lost(&engine, 1);
    assert!(drain_raw(&mut rx).is_empty());

    // The client sees every token once: the two from worker 1, then the rest from worker 0.
    tokens(&engine, 1, on_one.id(), &[99], Some("stop")); // the dead device: ignored
    tokens(&engine, 0, on_one.id(), &[9], Some("length"));
    for (ids, finish) in [(vec![7, 8], None), (vec![9], Some(FinishReason::Length))] {
        let want = Event::Tokens {
            ids,
            finish,
            logprobs: None,
        };
        assert_eq!(on_one.recv().await, Some(want));
    }
    tokens(&engine, 0, on_zero.id(), &[3], Some("stop"));
    assert!(matches!(on_zero.recv().await, Some(Event::Tokens { .. })));
    let tm = engine.metrics.tier(TierId(0));
    assert_eq!(tm.resumed.load(Ordering::Relaxed), 1);

    // The restarted device registers again and is back in the plan.
    register(&engine, 1);
    let leaders: Vec<u32> = engine.plan().groups.iter().map(|g| g.leader()).collect();
    assert_eq!(leaders, [0, 1]);
}
