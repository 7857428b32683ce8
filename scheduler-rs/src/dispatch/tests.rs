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
    // Spills overfill groups 0 and 1 (3 each): two completions on group 1 free one slot.
    d.complete(1);
    assert_eq!(
        d.dispatch(8, &req("strict")).unwrap().class,
        Class::BestEffort
    );
    d.complete(8);
    d.complete(3);
    let again = d.dispatch(7, &req("strict")).unwrap();
    assert_eq!((again.prefill_leader, again.class), (1, Class::Feasible));
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
