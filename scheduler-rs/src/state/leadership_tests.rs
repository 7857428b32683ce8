//! Several routers (architecture §4): a follower never sends `reconfigure` and routes by the
//! leader's plan; a new leader numbers its plans above every epoch in use; the leader merges a
//! follower's window and splits each group's SLO bandwidth between the routers.

use std::sync::Arc;

use super::tests::{drain_raw, register, submit};
use super::{RouterRole as Role, RouterState};
use crate::config::RouterConfig;
use crate::dispatch::Class;
use crate::lease::{LeaderInfo, LeaseSpec};
use crate::plan::{GroupPlan, Role as GroupRole};
use crate::protocols::peer::PeerStats;

fn several(control: bool) -> RouterConfig {
    RouterConfig {
        lease: Some(LeaseSpec::File("/nonexistent/lease".into())),
        // NOTE: only turns the window statistics on; no control loop runs in these tests.
        profile: control.then(|| "profile.json".into()),
        ..RouterConfig::default()
    }
}

fn kinds(sent: &[(String, serde_json::Value)], kind: &str) -> Vec<u64> {
    sent.iter()
        .filter(|(_, v)| v["type"] == kind)
        .map(|(_, v)| v["epoch"].as_u64().unwrap_or(0))
        .collect()
}

#[tokio::test]
async fn a_follower_sends_no_plan_and_routes_by_the_leaders() {
    let (leader, mut lrx) = RouterState::new(Arc::new(several(false)));
    let (follower, mut frx) = RouterState::new(Arc::new(several(false)));
    assert_eq!(follower.role(), Role::Follower { leader: None });
    for w in 0..2 {
        register(&leader, w);
        register(&follower, w);
    }
    // Until it leads a router plans nothing: registered, no reconfigure, epoch 0.
    let sent = drain_raw(&mut frx);
    assert_eq!(kinds(&sent, "registered"), [0, 0]);
    assert!(kinds(&sent, "reconfigure").is_empty());
    drain_raw(&mut lrx);
    leader.promote(7);
    let epoch = leader.plan().epoch;
    assert_eq!(epoch, (7 << 32) + 1);
    assert_eq!(kinds(&drain_raw(&mut lrx), "reconfigure"), [epoch, epoch]);
    assert_eq!(leader.leader_plan().unwrap().term, 7);
    assert!(follower.leader_plan().is_none());
    // The follower takes the leader's plan once; a replay, or an older term's, not.
    let plan = leader.leader_plan().unwrap();
    assert!(follower.adopt_plan(plan.clone()));
    assert!(!follower.adopt_plan(plan.clone()));
    let older = crate::protocols::peer::PeerPlan {
        term: 6,
        sent_ms: plan.sent_ms + 1000,
        ..plan.clone()
    };
    assert!(!follower.adopt_plan(older));
    assert_eq!(follower.plan(), leader.plan());
    // A worker's death changes the follower's routing, not the workers' plan.
    register(&follower, 2);
    assert!(kinds(&drain_raw(&mut frx), "reconfigure").is_empty());
    assert_eq!(follower.plan().epoch, epoch, "a follower numbers no plan");
    // It dispatches by the plan it took.
    let h = follower.submit(submit()).unwrap();
    let sent = drain_raw(&mut frx);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].1["type"], "generate");
    drop(h);
}

#[tokio::test]
async fn a_new_leader_numbers_its_plans_above_every_epoch_in_use() {
    let (a, _arx) = RouterState::new(Arc::new(several(false)));
    let (b, mut brx) = RouterState::new(Arc::new(several(false)));
    register(&a, 0);
    register(&b, 0);
    a.promote(5);
    assert!(b.adopt_plan(a.leader_plan().unwrap()));
    b.follow(Some(LeaderInfo {
        index: 0,
        addr: "tcp://127.0.0.1:1".into(),
        term: 5,
    }));
    // b takes the lease under a term the store lost track of (below 5): its plans must still
    // outrank a's, or every worker would refuse them.
    drain_raw(&mut brx);
    b.promote(2);
    let e = b.plan().epoch;
    assert!(e > a.plan().epoch, "{e} > {}", a.plan().epoch);
    assert_eq!(e >> 32, 6);
    assert_eq!(kinds(&drain_raw(&mut brx), "reconfigure"), [e]);
    // Deposed, a follower again: its routing keeps the plan, it sends no more plans.
    b.follow(None);
    assert!(!b.plans());
    register(&b, 1);
    assert!(kinds(&drain_raw(&mut brx), "reconfigure").is_empty());
}

fn stats(term: u64, sent_ms: u64, arrivals: usize) -> PeerStats {
    PeerStats {
        term,
        sent_ms,
        full: false,
        arrivals: vec![("strict".into(), 0.1, 64); arrivals],
        completions: vec![("strict".into(), 0.1, 32)],
        outcomes: vec![(0.2, "strict".into(), true)],
        inflight: vec![("strict".into(), 5.0, 0.3, true)],
    }
}

#[tokio::test]
async fn the_leader_merges_a_followers_window_and_shares_bandwidth() {
    let (leader, _rx) = RouterState::new(Arc::new(several(true)));
    register(&leader, 0);
    leader.promote(1);
    let rate = |r: &RouterState| {
        r.demand_snapshot()
            .iter()
            .find(|d| d.tier == "strict")
            .map_or(0.0, |d| d.rate_rps)
    };
    assert_eq!(rate(&leader), 0.0);
    assert!(leader.merge_peer_stats(1, stats(1, 100, 3)));
    assert_eq!(rate(&leader), 3.0, "3 arrivals in the 1 s window");
    assert_eq!(
        leader.inflight_snapshot().len(),
        1,
        "the follower's request in flight"
    );
    assert_eq!(leader.recent_outcomes(60.0).1.len(), 1);
    // A replay, or statistics meant for another term's leader, change nothing.
    assert!(!leader.merge_peer_stats(1, stats(1, 100, 3)));
    assert!(!leader.merge_peer_stats(2, stats(9, 200, 3)));
    assert_eq!(rate(&leader), 3.0);
    // Two routers now share each group's SLO bandwidth: 4 in flight become 2 each.
    assert_eq!(leader.leader_plan().unwrap().routers, 2);
    leader.set_plan(vec![GroupPlan {
        members: vec![0],
        tp: 1,
        pp: 1,
        role: GroupRole::Mixed,
        tiers: vec![crate::ids::TierId(0)],
        accepts_background: true,
        max_rps: 8.0,
        max_inflight: 4.0,
    }]);
    let hs: Vec<_> = (0..3).map(|_| leader.submit(submit()).unwrap()).collect();
    let classes: Vec<Class> = hs.iter().map(|h| h.class()).collect();
    assert_eq!(
        classes,
        [Class::Feasible, Class::Feasible, Class::BestEffort]
    );
}

#[tokio::test]
async fn a_follower_sends_its_history_once_then_what_is_new() {
    let (follower, _rx) = RouterState::new(Arc::new(several(true)));
    register(&follower, 0);
    let h = follower.submit(submit()).unwrap();
    let first = follower.peer_stats(4);
    assert!(first.full);
    assert_eq!(first.arrivals.len(), 1);
    assert_eq!(first.inflight.len(), 1);
    let next = follower.peer_stats(4);
    assert!(!next.full && next.arrivals.is_empty(), "sent already");
    let h2 = follower.submit(submit()).unwrap();
    let next = follower.peer_stats(4);
    assert_eq!(
        (next.full, next.arrivals.len(), next.inflight.len()),
        (false, 1, 2)
    );
    // A new leader (another term) gets the whole history again.
    let new = follower.peer_stats(5);
    assert_eq!((new.full, new.arrivals.len()), (true, 2));
    drop((h, h2));
}
