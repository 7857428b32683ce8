//! Control rounds without a network: acks decide whether routing switches, refusals and
//! timeouts keep the old plan, in-flight requests survive a regrouping.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde_json::json;

use super::tests::{drain_raw, msg, register, submit, tokens};
use super::{Event, FinishReason, PlanResult, RoundOutcome, RouterState};
use crate::config::RouterConfig;
use crate::ids::WorkerId;
use crate::plan::{GroupPlan, Role};

fn group(members: &[u32], tiers: &[&str]) -> GroupPlan {
    GroupPlan {
        members: members.to_vec(),
        tp: members.len() as u32,
        pp: 1,
        role: Role::Mixed,
        tiers: tiers
            .iter()
            .map(|name| {
                RouterConfig::default()
                    .tier_index(name)
                    .expect("a default tier")
            })
            .collect(),
        accepts_background: true,
        max_rps: 10.0,
        max_inflight: 4.0,
    }
}

fn ack(engine: &RouterState, worker: u32, epoch: u64, ok: bool) {
    msg(
        engine,
        worker,
        json!({"v": 1, "type": "reconfigured", "worker_id": worker, "epoch": epoch, "ok": ok,
               "error": if ok { None } else { Some("cannot run TP 2") }}),
    );
}

fn control_cfg() -> Arc<RouterConfig> {
    Arc::new(RouterConfig {
        profile: Some("unused.json".into()),
        ..RouterConfig::default()
    })
}

#[tokio::test]
async fn acknowledged_round_switches_routing_and_keeps_inflight_requests() {
    let (engine, mut rx) = RouterState::new(control_cfg());
    register(&engine, 0);
    register(&engine, 1);
    drain_raw(&mut rx);
    let before = engine.plan();
    // A request on worker 1 (the second TP-1 group) is in flight across the switch.
    let _first = engine.submit(submit()).unwrap();
    let mut second = engine.submit(submit()).unwrap();
    let sent = drain_raw(&mut rx);
    assert_eq!(sent.last().unwrap().0, "1");

    let (epoch, mut done) = engine.begin_round(
        vec![group(&[0, 1], &["strict"])],
        vec![12.7],
        Vec::new(),
        0.1,
    );
    assert!(epoch > before.epoch);
    let sent = drain_raw(&mut rx);
    assert_eq!(sent.len(), 2, "reconfigure to both workers");
    for (_, v) in &sent {
        assert_eq!(v["type"], "reconfigure");
        assert_eq!(v["epoch"], epoch);
        assert_eq!(v["groups"][0]["max_batch"], 12);
    }
    // Routing stays on the old plan until every worker acknowledged.
    ack(&engine, 0, epoch, true);
    assert!(done.try_recv().is_err());
    assert_eq!(engine.plan(), before);
    ack(&engine, 0, epoch - 1, true); // an old epoch's ack changes nothing
    ack(&engine, 1, epoch, true);
    assert!(done.try_recv().is_ok());
    let rec = engine.end_round(epoch, RoundOutcome::Answered).unwrap();
    assert_eq!(rec.result, PlanResult::Applied);
    let plan = engine.plan();
    assert_eq!(
        (plan.epoch, plan.groups.len(), plan.groups[0].tp),
        (epoch, 1, 2)
    );
    assert!(
        drain_raw(&mut rx).is_empty(),
        "workers already have this epoch"
    );
    assert_eq!(engine.metrics.plan_applied.load(Ordering::Relaxed), 1);
    assert_eq!(engine.plan_history().len(), 1);
    // Worker 1 is now a member of the group led by 0, which finishes its request.
    tokens(&engine, 0, second.id(), &[4], Some("length"));
    assert_eq!(
        second.recv().await,
        Some(Event::Tokens {
            ids: vec![4],
            finish: Some(FinishReason::Length),
            logprobs: None
        })
    );
    // A later rebuild (a new worker) re-broadcasts the plan with its batch cap.
    register(&engine, 2);
    let sent = drain_raw(&mut rx);
    let rc = sent
        .iter()
        .find(|(_, v)| v["type"] == "reconfigure")
        .unwrap();
    assert_eq!(rc.1["groups"][0]["max_batch"], 12);
    assert!(rc.1["epoch"].as_u64().unwrap() > epoch);
}

#[tokio::test]
async fn refused_or_unanswered_round_keeps_the_old_plan() {
    let (engine, mut rx) = RouterState::new(control_cfg());
    register(&engine, 0);
    register(&engine, 1);
    drain_raw(&mut rx);
    let before = engine.plan();

    let (epoch, mut done) = engine.begin_round(
        vec![group(&[0, 1], &["strict"])],
        vec![0.0],
        Vec::new(),
        0.1,
    );
    let sent = drain_raw(&mut rx);
    assert!(sent
        .iter()
        .all(|(_, v)| v["groups"][0].get("max_batch").is_none()));
    ack(&engine, 0, epoch, true);
    ack(&engine, 1, epoch, false);
    assert!(done.try_recv().is_ok(), "a refusal decides the round");
    let rec = engine.end_round(epoch, RoundOutcome::Answered).unwrap();
    assert_eq!(rec.result, PlanResult::Refused);
    assert_eq!(rec.refused[0].worker, WorkerId(1));
    assert_eq!(rec.refused[0].error.as_deref(), Some("cannot run TP 2"));
    let after = engine.plan();
    assert_eq!(after.groups, before.groups);
    assert!(after.epoch > epoch);
    // The old plan goes out again under the new epoch so worker 0 switches back.
    let sent = drain_raw(&mut rx);
    assert_eq!(sent.len(), 2);
    assert!(sent.iter().all(|(_, v)| v["epoch"] == after.epoch));
    assert_eq!(engine.metrics.plan_refused.load(Ordering::Relaxed), 1);

    // Timeout: worker 1 never answers.
    let (epoch, _done) = engine.begin_round(
        vec![group(&[0, 1], &["strict"])],
        vec![0.0],
        Vec::new(),
        0.1,
    );
    ack(&engine, 0, epoch, true);
    assert!(engine.round_pending());
    let rec = engine.end_round(epoch, RoundOutcome::TimedOut).unwrap();
    assert_eq!(
        (rec.result, rec.missing.clone()),
        (PlanResult::Timeout, vec![WorkerId(1)])
    );
    assert_eq!(engine.plan().groups, before.groups);
    assert!(!engine.round_pending());
    assert!(engine.end_round(epoch, RoundOutcome::Answered).is_none());
    assert_eq!(engine.metrics.plan_timeout.load(Ordering::Relaxed), 1);
    let results: Vec<_> = engine.plan_history().iter().map(|r| r.result).collect();
    assert_eq!(results, [PlanResult::Refused, PlanResult::Timeout]);
    let mut text = String::new();
    engine.metrics.render(&mut text);
    assert!(text.contains("nitsum_plan_changes_total{result=\"refused\"} 1"));
    assert!(text.contains("nitsum_plan_changes_total{result=\"timeout\"} 1"));
    assert!(text.contains("nitsum_plan_changes_total{result=\"applied\"} 0"));
}

#[tokio::test]
async fn request_path_feeds_window_stats_only_with_the_control_loop() {
    for (cfg, expect) in [
        (control_cfg(), 1usize),
        (Arc::new(RouterConfig::default()), 0),
    ] {
        let (engine, mut rx) = RouterState::new(cfg);
        register(&engine, 0);
        let mut h = engine.submit(submit()).unwrap();
        drain_raw(&mut rx);
        tokens(&engine, 0, h.id(), &[1, 2, 3], Some("length"));
        h.recv().await;
        let demand = engine.demand_snapshot();
        assert_eq!(demand.len(), expect);
        if let Some(d) = demand.first() {
            assert_eq!(d.tier, "strict");
            assert!(d.rate_rps > 0.0);
            assert_eq!((d.prompt.mean, d.output.mean), (2.0, 3.0));
        }
    }
}

#[tokio::test]
async fn a_capacity_only_change_refreshes_routing_without_a_round() {
    let (engine, mut rx) = RouterState::new(control_cfg());
    register(&engine, 0);
    register(&engine, 1);
    drain_raw(&mut rx);
    let (epoch, _done) = engine.begin_round(
        vec![group(&[0], &["strict"]), group(&[1], &["relaxed"])],
        vec![20.0, 0.0],
        Vec::new(),
        0.1,
    );
    drain_raw(&mut rx);
    ack(&engine, 0, epoch, true);
    ack(&engine, 1, epoch, true);
    engine.end_round(epoch, RoundOutcome::Answered).unwrap();
    drain_raw(&mut rx);
    // New capacities, batch cap 21 (within 10% of 20): routing only, same epoch, no message.
    let mut groups = vec![group(&[0], &["strict"]), group(&[1], &["relaxed"])];
    groups[0].max_rps = 55.0;
    assert!(engine.refresh_capacities(&groups, &[21.0, 0.0]));
    let plan = engine.plan();
    assert_eq!((plan.epoch, plan.groups[0].max_rps), (epoch, 55.0));
    assert!(
        drain_raw(&mut rx).is_empty(),
        "no reconfigure for capacities"
    );
    // A batch cap far off, a tier moved or a TP change needs a real round.
    assert!(!engine.refresh_capacities(&groups, &[40.0, 0.0]));
    let moved = vec![group(&[0], &["relaxed"]), group(&[1], &["strict"])];
    assert!(!engine.refresh_capacities(&moved, &[20.0, 0.0]));
    assert!(!engine.refresh_capacities(&[group(&[0, 1], &["strict"])], &[20.0]));
    let strict = RouterConfig::default().tier_index("strict").unwrap();
    assert_eq!(engine.plan().groups[0].tiers, [strict]);
}
