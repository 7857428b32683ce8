//! Simulator tests: a hand-computed single-device queue, and whole-policy runs.

use super::*;
use crate::planner::strategy::Strategy;

/// Prefill 1 ms per token with no fixed part (10 ms for the 10-token prompts below, alone or
/// riding a decode step); decode step always 5 ms (any batch, any context).
fn constant_profile() -> ProfileFile {
    serde_json::from_str(
        r#"{"schema": "nitsum-profile/1", "device": "t", "model": "m", "tp_levels": [1],
        "prefill": {"1": [{"tokens": 10, "ms": 10}, {"tokens": 20, "ms": 20}]},
        "decode": {"1": [{"batch": 1, "context": 1, "ms": 5}, {"batch": 64, "context": 1, "ms": 5}]}}"#,
    )
    .unwrap()
}

fn req(t: f64, input: u32, output: u32, tier: &str) -> TraceRequest {
    TraceRequest {
        arrival_s: t,
        input_len: input,
        output_len: output,
        tier: tier.into(),
        leftover: false,
    }
}

fn config(policy: Policy, devices: u32, requests: Vec<TraceRequest>) -> SimConfig {
    serde_json::from_value(serde_json::json!({
        "profile": constant_profile(),
        "tiers": [{"name": "t", "ttft_ms": 15.0, "tpot_ms": 6.0}],
        "devices": devices,
        "policy": policy,
        "requests": requests,
    }))
    .unwrap()
}

fn close(a: Option<f64>, b: f64) -> bool {
    a.is_some_and(|a| (a - b).abs() < 1e-9)
}

#[test]
fn spaced_arrivals_never_queue() {
    let trace = (0..5)
        .map(|k| req(0.1 * f64::from(k), 10, 3, "t"))
        .collect();
    let out = simulate(&config(
        Policy::Fixed(Strategy::StaticTp { tp: 1 }),
        1,
        trace,
    ))
    .unwrap();
    // Each: one 10 ms prefill (first token), then two 5 ms decode steps.
    for r in &out.records {
        assert!(
            close(r.ttft_ms, 10.0) && close(r.e2e_ms, 20.0) && close(r.tpot_ms, 5.0),
            "{r:?}"
        );
        assert!(r.met);
    }
    assert_eq!((out.requests, out.met), (5, 5));
    // Span 0.4 s is padded to 1 s.
    assert_eq!(out.goodput_rps, 5.0);
}

#[test]
fn overlapping_arrivals_match_the_hand_computed_schedule() {
    let trace = vec![
        req(0.0, 10, 3, "t"),
        req(0.004, 10, 3, "t"),
        req(2.0, 10, 3, "t"),
    ];
    let out = simulate(&config(
        Policy::Fixed(Strategy::StaticTp { tp: 1 }),
        1,
        trace,
    ))
    .unwrap();
    let r = &out.records;
    // t=0: prefill A → 10 ms (A's first token). t=10: decode A + prefill B = 15 ms → 25
    // (B's first token, A has 2). t=25: decode A, B → 30: A done. t=30: decode B → 35: done.
    assert!(close(r[0].ttft_ms, 10.0) && close(r[0].e2e_ms, 30.0) && close(r[0].tpot_ms, 10.0));
    assert!(close(r[1].ttft_ms, 21.0) && close(r[1].e2e_ms, 31.0) && close(r[1].tpot_ms, 5.0));
    // A misses TPOT (10 > 6), B misses TTFT (21 > 15); C runs alone and meets both.
    assert_eq!(
        r.iter().map(|r| r.met).collect::<Vec<_>>(),
        [false, false, true]
    );
    assert_eq!(out.per_tier["t"].attainment, 1.0 / 3.0);
    assert_eq!(out.goodput_rps, 0.5);
}

#[test]
fn disaggregated_handoff_pays_the_kv_transfer() {
    let plan: crate::plan::NamedPlan = serde_json::from_str(
        r#"{"epoch": 1, "groups": [
            {"members": [0], "tp": 1, "role": "prefill", "tiers": ["t"], "accepts_background": false, "max_rps": 0},
            {"members": [1], "tp": 1, "role": "decode", "tiers": ["t"], "accepts_background": false, "max_rps": 0}]}"#,
    )
    .unwrap();
    let mut cfg = config(
        Policy::FixedPlan {
            plan,
            batch_caps: vec![],
            reject_best_effort: false,
        },
        2,
        vec![req(0.0, 10, 3, "t")],
    );
    cfg.kv_bytes_per_token = 1e6;
    cfg.kv_bandwidth_gbps = 1.0;
    let out = simulate(&cfg).unwrap();
    let r = &out.records[0];
    // Prefill 10 ms (first token); 10 tokens × 1 MB at 1 GB/s = 10 ms of KV transfer; then two
    // 5 ms decode steps on the decode group: done at 30 ms, TPOT (30 − 10) / 2 = 10 ms.
    assert!(
        close(r.ttft_ms, 10.0) && close(r.e2e_ms, 30.0) && close(r.tpot_ms, 10.0),
        "{r:?}"
    );
    assert_eq!(out.policy, "fixed-plan");
}

fn two_tier_trace() -> Vec<TraceRequest> {
    // Deterministic bursty mix: tier "fast" every 10 ms for 3 s, "slow" every 25 ms.
    let mut v: Vec<TraceRequest> = (0..300)
        .map(|k| req(0.01 * f64::from(k), 64 + (k % 7) * 30, 8 + k % 5, "fast"))
        .collect();
    v.extend((0..120).map(|k| req(0.025 * f64::from(k), 400, 32, "slow")));
    v.sort_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s));
    v
}

fn two_tier_config(policy: Policy) -> SimConfig {
    let mut cfg = config(policy, 8, two_tier_trace());
    cfg.profile = serde_json::from_str(
        r#"{"schema": "nitsum-profile/1", "device": "t", "model": "m", "tp_levels": [1, 2, 4],
        "prefill": {"1": [{"tokens": 1, "ms": 6}, {"tokens": 4096, "ms": 206}],
                    "2": [{"tokens": 1, "ms": 7}, {"tokens": 4096, "ms": 107}],
                    "4": [{"tokens": 1, "ms": 9}, {"tokens": 4096, "ms": 59}]},
        "decode": {"1": [{"batch": 1, "context": 256, "ms": 8}, {"batch": 128, "context": 256, "ms": 40}],
                   "2": [{"batch": 1, "context": 256, "ms": 5}, {"batch": 128, "context": 256, "ms": 22}],
                   "4": [{"batch": 1, "context": 256, "ms": 4}, {"batch": 128, "context": 256, "ms": 13}]}}"#,
    )
    .unwrap();
    cfg.tiers = serde_json::from_str(
        r#"[{"name": "fast", "ttft_ms": 150, "tpot_ms": 25}, {"name": "slow", "ttft_ms": 2000, "tpot_ms": 60}]"#,
    )
    .unwrap();
    cfg
}

#[test]
fn every_policy_runs_every_request_deterministically() {
    let policies = [
        Policy::Adaptive,
        Policy::Fixed(Strategy::FixedTp { tp: 2 }),
        Policy::Fixed(Strategy::StaticTp { tp: 2 }),
        Policy::Fixed(Strategy::Split),
        Policy::Fixed(Strategy::Greedy),
    ];
    for p in policies {
        let cfg = two_tier_config(p.clone());
        let a = simulate(&cfg).unwrap();
        assert_eq!(a, simulate(&cfg).unwrap(), "{p:?} is not deterministic");
        assert_eq!(a.requests, 420);
        let t = &a.per_tier;
        let accounted = t.values().map(|t| t.requests).sum::<u64>();
        assert_eq!(accounted, 420);
        // Nothing is lost: each request finished, or was dropped by an explicit rejection.
        for r in &a.records {
            assert!(r.e2e_ms.is_some() || r.dropped, "{p:?}: {r:?}");
        }
        if matches!(p, Policy::Adaptive) {
            assert!(a.reconfigurations >= 1);
        }
    }
}

#[test]
fn config_errors_are_clear() {
    let mut cfg = config(
        Policy::Fixed(Strategy::StaticTp { tp: 2 }),
        1,
        vec![req(0.0, 1, 1, "t")],
    );
    let e = simulate(&cfg).unwrap_err().to_string();
    assert!(e.contains("TP 2 is not in the profile"), "{e}");
    cfg.policy = Policy::Fixed(Strategy::StaticTp { tp: 1 });
    cfg.requests[0].tier = "nope".into();
    let e = simulate(&cfg).unwrap_err().to_string();
    assert!(e.contains("unknown tier"), "{e}");
}

/// A prefilled request (1 token generated) of `class` for the engine-level tests.
fn decoding(output: u32, class: crate::dispatch::Class) -> reqs::Req {
    reqs::Req {
        arrival: 0.0,
        input: 10,
        output,
        tier: crate::ids::TierId(0),
        class,
        prefilled: 10,
        generated: 1,
        first_token: Some(0.0),
        finish: None,
        decode_leader: None,
        dropped: false,
        deadline: 1.0,
        stint: None,
        leftover: false,
    }
}

/// A waiting request with an `input`-token prompt due (first token) by `deadline`.
fn waiting(input: u32, deadline: f64) -> reqs::Req {
    reqs::Req {
        input,
        prefilled: 0,
        generated: 0,
        first_token: None,
        deadline,
        ..decoding(3, crate::dispatch::Class::Feasible)
    }
}

fn one_device_group() -> crate::plan::GroupPlan {
    crate::plan::GroupPlan {
        members: vec![0],
        tp: 1,
        pp: 1,
        role: crate::plan::Role::Mixed,
        tiers: vec![crate::ids::TierId(0)], // "t", the configs' only tier
        accepts_background: true,
        max_rps: 0.0,
        max_inflight: 0.0,
    }
}

#[test]
fn a_prompt_that_cannot_make_its_ttft_is_demoted_before_work_is_spent_on_it() {
    use crate::dispatch::Class;
    let profile = crate::profile::Profile::from_file(constant_profile()).unwrap();
    // 10 prompt tokens an iteration at 1 ms a token: a 40-token prompt needs 4 iterations,
    // at least 30 ms for the 3 full ones (the lower bound counts the last as free).
    let mut e = group::GroupSim::new(one_device_group(), 4, 10, 0.0, 1);
    e.demote_late = true;
    // r0 is due in 25 ms: hopeless. r1 (20 tokens, due in 100 ms) is fine; r2 (20 tokens
    // behind r1's 20, due in 35 ms) might still make it: at least 30 ms.
    let mut reqs = super::reqs::Reqs::from(vec![
        waiting(40, 0.025),
        waiting(20, 0.1),
        waiting(20, 0.035),
    ]);
    for r in 0..3 {
        e.push_prefill(r, Class::Feasible);
    }
    let t = e
        .start(&mut reqs, &profile, 0.0)
        .expect("a prefill iteration");
    assert_eq!(e.take_demoted(), vec![0]);
    assert_eq!(reqs[0].class, Class::Background);
    assert_eq!([reqs[1].class, reqs[2].class], [Class::Feasible; 2]);
    e.finish(&mut reqs, t);
    assert_eq!(
        [reqs[0].prefilled, reqs[1].prefilled, reqs[2].prefilled],
        [0, 10, 0],
        "r1 got the budget, not the hopeless r0"
    );
    // Without the rule r0, first in line, would have taken it.
    let mut e = group::GroupSim::new(one_device_group(), 4, 10, 0.0, 2);
    let mut reqs = super::reqs::Reqs::from(vec![waiting(40, 0.025), waiting(20, 0.1)]);
    e.push_prefill(0, Class::Feasible);
    e.push_prefill(1, Class::Feasible);
    let t = e.start(&mut reqs, &profile, 0.0).unwrap();
    e.finish(&mut reqs, t);
    assert_eq!([reqs[0].prefilled, reqs[1].prefilled], [10, 0]);
}

#[test]
fn the_decode_batch_counts_tokens_per_step_and_writes_them_back_on_leaving() {
    use crate::dispatch::Class;
    let profile = crate::profile::Profile::from_file(constant_profile()).unwrap();
    let mut e = group::GroupSim::new(one_device_group(), 1, 512, 0.0, 7);
    // r0 (best effort, 5 tokens) decodes alone, then r1 (feasible, 3 tokens) takes its slot.
    let mut reqs = super::reqs::Reqs::from(vec![
        decoding(5, Class::BestEffort),
        decoding(3, Class::Feasible),
    ]);
    e.push_decode(0, Class::BestEffort);
    let mut t = 0.0;
    for _ in 0..2 {
        t += e.start(&mut reqs, &profile, t).expect("a decode step");
        assert!(e.finish(&mut reqs, t).finished.is_empty());
    }
    e.sync(&mut reqs);
    assert_eq!(reqs[0].generated, 3, "1 + two steps");
    e.push_decode(1, Class::Feasible);
    t += e.start(&mut reqs, &profile, t).expect("r1 decodes");
    // r0 was preempted for r1 with its count written back; r1 is one step in.
    assert_eq!(reqs[0].generated, 3);
    assert!(reqs[0].stint.is_none());
    assert!(e.finish(&mut reqs, t).finished.is_empty());
    t += e.start(&mut reqs, &profile, t).unwrap();
    assert_eq!(
        e.finish(&mut reqs, t).finished,
        vec![1],
        "r1: 1 + 2 steps = 3 tokens"
    );
    assert_eq!(reqs[1].generated, 3);
    assert!(close(reqs[1].finish, t));
    // r0 resumes where it stopped: 2 more steps to its 5 tokens.
    t += e.start(&mut reqs, &profile, t).unwrap();
    assert!(e.finish(&mut reqs, t).finished.is_empty());
    t += e.start(&mut reqs, &profile, t).unwrap();
    assert_eq!(e.finish(&mut reqs, t).finished, vec![0]);
    assert_eq!(reqs[0].generated, 5);
    assert!(e.start(&mut reqs, &profile, t).is_none(), "nothing left");
}

#[test]
fn a_leftover_request_is_served_as_background_whatever_its_tier() {
    let mut reqs = vec![req(0.0, 10, 3, "t"), req(0.0, 10, 3, "t")];
    reqs[1].leftover = true;
    let mut cfg = config(Policy::Fixed(Strategy::StaticTp { tp: 1 }), 1, reqs);
    cfg.records = true;
    let r = simulate(&cfg).unwrap();
    assert_eq!(r.records[0].class, "feasible");
    assert_eq!(r.records[1].class, "background");
}

#[test]
fn a_tier_that_rejects_unattainable_requests_drops_its_best_effort_ones_only() {
    // The router answers 429 `slo_unattainable`; the simulator drops them the same way.
    let count = |reject: bool| {
        let mut cfg = two_tier_config(Policy::Fixed(Strategy::Greedy));
        cfg.devices = 2;
        cfg.records = true;
        cfg.tiers[0].reject_unattainable = reject;
        let r = simulate(&cfg).unwrap();
        let by = |tier: &str, f: &dyn Fn(&RequestRecord) -> bool| {
            r.records.iter().filter(|x| x.tier == tier && f(x)).count()
        };
        (
            by("fast", &|x| x.dropped),
            by("fast", &|x| x.class == "best_effort" && !x.dropped),
            by("slow", &|x| x.dropped),
        )
    };
    let (dropped, best_effort, _) = count(false);
    assert_eq!(dropped, 0);
    assert!(
        best_effort > 0,
        "the workload must exceed the fast tier's SLO bandwidth"
    );
    let (dropped, best_effort, slow_dropped) = count(true);
    assert!(dropped > 0);
    assert_eq!(best_effort, 0, "none served best effort");
    assert_eq!(slow_dropped, 0, "the other tier is unaffected");
}

#[test]
fn short_prompts_overtake_a_long_one_that_can_spare_the_tokens() {
    use crate::dispatch::Class;
    let profile = crate::profile::Profile::from_file(constant_profile()).unwrap();
    // 10 prompt tokens an iteration at 1 ms a token. A 100-token prompt and two 3-token ones
    // behind it; the long one's deadline decides what it spares (python/nitsum/engine/
    // prompt_order.py does the same in the worker).
    let prefilled = |long_deadline: f64, class: Class, nitsum: bool| {
        let mut e = group::GroupSim::new(one_device_group(), 4, 10, 0.0, 1);
        e.demote_late = nitsum;
        let mut reqs = super::reqs::Reqs::from(vec![
            waiting(100, long_deadline),
            waiting(3, 1.0),
            waiting(3, 1.0),
        ]);
        for r in 0..3 {
            reqs[r].class = class;
            e.push_prefill(r, class);
        }
        let t = e.start(&mut reqs, &profile, 0.0).unwrap();
        e.finish(&mut reqs, t);
        [reqs[0].prefilled, reqs[1].prefilled, reqs[2].prefilled]
    };
    // Plenty of slack (10 iterations of 10 ms needed, 1 s left): both shorts first.
    assert_eq!(prefilled(1.0, Class::Feasible, true), [4, 3, 3]);
    // Just enough time for its own 10 iterations: nothing to spare, FCFS.
    assert_eq!(prefilled(0.105, Class::Feasible, true), [10, 0, 0]);
    // Background (no SLO to keep): shorts take up to half the budget (5: one of them).
    assert_eq!(prefilled(0.0, Class::Background, true), [7, 3, 0]);
    // The SLO-agnostic baselines keep FCFS.
    assert_eq!(prefilled(1.0, Class::Feasible, false), [10, 0, 0]);
}
