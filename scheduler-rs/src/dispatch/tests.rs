//! Dispatch policy tests: tier placement, P/D pairing, spill and load across plans.

use super::*;

fn group(members: &[u32], role: Role, tiers: &[&str], bg: bool, cap: f64) -> GroupPlan {
    GroupPlan {
        members: members.to_vec(),
        tp: members.len() as u32,
        pp: 1,
        role,
        tiers: tiers.iter().map(|name| tier(name)).collect(),
        accepts_background: bg,
        max_rps: 0.0,
        max_inflight: cap,
    }
}

/// The tier list every test dispatches for; a request's or group's `TierId` is its position
/// here.
const TIERS: [&str; 5] = ["strict", "relaxed", "t", "batch", "b"];

fn tier(name: &str) -> TierId {
    TierId(TIERS.iter().position(|t| *t == name).expect("a test tier"))
}

fn req(name: &str) -> DispatchRequest {
    DispatchRequest {
        tier: tier(name),
        background: false,
        affinity: None,
    }
}

#[test]
fn feasible_goes_to_least_loaded_prefill_group_of_its_tier() {
    let plan = Plan {
        epoch: 1,
        groups: vec![
            group(&[0], Role::Mixed, &["strict"], false, 2.0),
            group(&[1], Role::Mixed, &["strict"], false, 2.0),
            group(&[2], Role::Mixed, &["relaxed"], true, 2.0),
        ],
    };
    let mut d = Dispatcher::new(&plan);
    let picks: Vec<_> = (0..4)
        .map(|i| d.dispatch(i, &req("strict")).unwrap())
        .collect();
    assert_eq!(
        picks.iter().map(|p| p.prefill_leader).collect::<Vec<_>>(),
        [0, 1, 0, 1]
    );
    assert!(picks
        .iter()
        .all(|p| p.class == Class::Feasible && p.decode_leader.is_none()));
    assert_eq!(d.available(0), 0.0);
    // Both strict groups full: the fifth is infeasible and spills round-robin over all.
    let spills: Vec<_> = (4..7)
        .map(|i| d.dispatch(i, &req("strict")).unwrap())
        .collect();
    assert!(spills.iter().all(|p| p.class == Class::BestEffort));
    assert_eq!(
        spills.iter().map(|p| p.prefill_leader).collect::<Vec<_>>(),
        [0, 1, 2]
    );
    // Spills hold no SLO bandwidth: they are counted apart, and one completion on group 1
    // frees a feasible slot there.
    assert_eq!((d.assigned(0), d.assigned(1), d.inflight()), (2, 2, 4));
    assert_eq!((d.leftover(0), d.leftover(1), d.leftover(2)), (1, 1, 1));
    d.complete(1);
    let again = d.dispatch(7, &req("strict")).unwrap();
    assert_eq!((again.prefill_leader, again.class), (1, Class::Feasible));
    d.complete(5);
    assert_eq!((d.leftover(1), d.inflight()), (0, 4));
}

#[test]
fn background_round_robins_over_accepting_groups() {
    let plan = Plan {
        epoch: 1,
        groups: vec![
            group(&[0], Role::Mixed, &["strict"], true, 1.0),
            group(&[1], Role::Mixed, &["strict"], false, 1.0),
            group(&[2, 3], Role::Mixed, &[], true, 1.0),
        ],
    };
    let mut d = Dispatcher::new(&plan);
    let bg = DispatchRequest {
        tier: tier("batch"),
        background: true,
        affinity: None,
    };
    let picks: Vec<_> = (0..4).map(|i| d.dispatch(i, &bg).unwrap()).collect();
    assert_eq!(
        picks.iter().map(|p| p.prefill_leader).collect::<Vec<_>>(),
        [0, 2, 0, 2]
    );
    assert!(picks.iter().all(|p| p.class == Class::Background));
}

#[test]
fn prefill_group_pairs_with_least_loaded_decode_group_of_tier() {
    let plan = Plan {
        epoch: 1,
        groups: vec![
            group(&[0, 1], Role::Prefill, &["strict"], false, 4.0),
            group(&[2], Role::Decode, &["strict"], false, 4.0),
            group(&[3], Role::Decode, &["strict"], false, 4.0),
        ],
    };
    let mut d = Dispatcher::new(&plan);
    let a = d.dispatch(0, &req("strict")).unwrap();
    let b = d.dispatch(1, &req("strict")).unwrap();
    assert_eq!((a.prefill_leader, a.decode_leader), (0, Some(2)));
    assert_eq!((b.prefill_leader, b.decode_leader), (0, Some(3)));
    assert_eq!(d.assigned(0), 2);
    d.complete(0);
    assert_eq!((d.assigned(0), d.assigned(2), d.assigned(3)), (1, 0, 1));
}

#[test]
fn a_prefill_group_without_any_decode_group_decodes_itself() {
    // The decode host died: the plan kept only the prefill group.
    let plan = Plan {
        epoch: 2,
        groups: vec![group(&[0, 1], Role::Prefill, &["strict"], false, 4.0)],
    };
    let d = Dispatcher::new(&plan).dispatch(0, &req("strict")).unwrap();
    assert_eq!((d.prefill_leader, d.decode_leader), (0, None));
}

#[test]
fn unbounded_capacity_and_no_groups() {
    let plan = Plan {
        epoch: 1,
        groups: vec![group(&[0], Role::Mixed, &["t"], false, 0.0)],
    };
    let mut d = Dispatcher::new(&plan);
    for i in 0..100 {
        assert_eq!(d.dispatch(i, &req("t")).unwrap().class, Class::Feasible);
    }
    // Background with no accepting group, and an empty plan, cannot be placed.
    assert!(d
        .dispatch(
            100,
            &DispatchRequest {
                tier: tier("b"),
                background: true,
                affinity: None,
            }
        )
        .is_none());
    let mut empty = Dispatcher::new(&Plan::default());
    assert!(empty.dispatch(0, &req("t")).is_none());
}

#[test]
fn surviving_groups_keep_their_load_across_plans() {
    let g0 = group(&[0], Role::Mixed, &["t"], false, 10.0);
    let g1 = group(&[1], Role::Mixed, &["t"], false, 10.0);
    let mut d = Dispatcher::new(&Plan {
        epoch: 1,
        groups: vec![g0.clone(), g1],
    });
    for i in 0..4 {
        d.dispatch(i, &req("t")).unwrap();
    }
    assert_eq!((d.assigned(0), d.assigned(1)), (2, 2));
    // [0] and [1] merge into a new TP2 group led by 0: a rebuilt group starts empty.
    let merged = group(&[0, 1], Role::Mixed, &["t"], false, 10.0);
    d.set_plan(&Plan {
        epoch: 2,
        groups: vec![merged],
    });
    assert_eq!(d.assigned(0), 0);
    // Old requests complete without underflow or touching the new group's count.
    d.dispatch(10, &req("t")).unwrap();
    for i in 0..4 {
        d.complete(i);
    }
    assert_eq!(d.assigned(0), 1);
    assert_eq!(d.inflight(), 1);
}

fn with_affinity(name: &str, background: bool, affinity: u32) -> DispatchRequest {
    DispatchRequest {
        tier: tier(name),
        background,
        affinity: Some(affinity),
    }
}

/// A default server's first plan: two devices that serve no tier yet, so every request spills.
fn no_tier_plan() -> Plan {
    Plan {
        epoch: 1,
        groups: vec![
            group(&[0], Role::Mixed, &[], true, 0.0),
            group(&[1], Role::Mixed, &[], true, 0.0),
        ],
    }
}

#[test]
fn spills_follow_their_prefix_group_within_a_slack() {
    // Issue 40 item 3: round-robin sent a conversation's second turn (and a repeated prompt)
    // to the device without its KV. Turn 1 went to group 1; every later turn follows it.
    let mut d = Dispatcher::new(&no_tier_plan());
    assert_eq!(d.dispatch(0, &req("t")).unwrap().prefill_leader, 0);
    let picks: Vec<_> = (1..5)
        .map(|i| d.dispatch(i, &with_affinity("t", false, 1)).unwrap())
        .collect();
    assert!(picks
        .iter()
        .all(|p| (p.prefill_leader, p.class) == (1, Class::BestEffort)));
    assert_eq!((d.leftover(0), d.leftover(1), d.inflight()), (1, 4, 0));
    // Group 1 now has SPILL_SLACK (4) more than group 0 when 0 is idle: the next one balances.
    d.complete(0);
    assert_eq!(
        d.dispatch(5, &with_affinity("t", false, 1))
            .unwrap()
            .prefill_leader,
        0
    );
    // A completion on group 1 brings it back within the slack of group 0.
    d.complete(1);
    assert_eq!(
        d.dispatch(6, &with_affinity("t", false, 1))
            .unwrap()
            .prefill_leader,
        1
    );
    // A finished spill releases its count; unknown and repeated completions change nothing.
    for id in [2, 3, 4, 6, 6, 99] {
        d.complete(id);
    }
    assert_eq!((d.leftover(0), d.leftover(1)), (1, 0));
    // An affinity to a group that is not in the plan is ignored.
    assert_eq!(
        d.dispatch(7, &with_affinity("t", false, 9))
            .unwrap()
            .prefill_leader,
        1
    );
}

#[test]
fn background_follows_its_prefix_group_among_accepting_groups() {
    let mut plan = no_tier_plan();
    plan.groups.push(group(&[2], Role::Mixed, &[], false, 0.0));
    let mut d = Dispatcher::new(&plan);
    let picks: Vec<_> = (0..3)
        .map(|i| d.dispatch(i, &with_affinity("b", true, 1)).unwrap())
        .collect();
    assert!(picks
        .iter()
        .all(|p| (p.prefill_leader, p.class) == (1, Class::Background)));
    // Group 2 takes no background work: an affinity to it is ignored (round-robin instead).
    let other = d.dispatch(3, &with_affinity("b", true, 2)).unwrap();
    assert_eq!(other.prefill_leader, 0);
}

#[test]
fn a_spill_follows_its_prefix_to_the_prefill_group_of_a_pd_plan() {
    // P/D: turn 1 was prefilled by group 2 (its KV and prefix cache are there), decoded by 4.
    let plan = Plan {
        epoch: 1,
        groups: vec![
            group(&[0, 1], Role::Prefill, &[], false, 0.0),
            group(&[2, 3], Role::Prefill, &[], false, 0.0),
            group(&[4], Role::Decode, &[], false, 0.0),
        ],
    };
    let mut d = Dispatcher::new(&plan);
    for i in 0..3 {
        let p = d.dispatch(i, &with_affinity("t", false, 2)).unwrap();
        assert_eq!((p.prefill_leader, p.decode_leader), (2, Some(4)));
    }
    // A decode group prefills nothing: an affinity to it never places the prefill there.
    let p = d.dispatch(3, &with_affinity("t", false, 4)).unwrap();
    assert_eq!((p.prefill_leader, p.decode_leader), (0, Some(4)));
}

#[test]
fn spill_counts_survive_unchanged_groups_and_are_forgotten_with_rebuilt_ones() {
    let mut d = Dispatcher::new(&no_tier_plan());
    for i in 0..3 {
        d.dispatch(i, &with_affinity("t", false, 1)).unwrap();
    }
    // Group 0 is rebuilt (now TP 2 with a new device), group 1 vanishes.
    let mut next = no_tier_plan();
    next.groups = vec![group(&[0, 2], Role::Mixed, &[], true, 0.0)];
    d.set_plan(&next);
    assert_eq!(d.leftover(0), 0);
    d.dispatch(10, &req("t")).unwrap();
    for i in 0..3 {
        d.complete(i);
    }
    assert_eq!(d.leftover(0), 1);
    // Back to the first plan: group 0's members changed again, so it starts from zero.
    d.set_plan(&no_tier_plan());
    assert_eq!((d.leftover(0), d.leftover(1)), (0, 0));
}
