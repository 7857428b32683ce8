//! Planner tests: hand-computed plans and property checks over random inputs.

use super::*;
use crate::plan::{GroupPlan, Role};
use crate::stats::LengthStats;

/// TP1 only. Prefill 10 ms + 0.1 ms/token (the 10 ms is paid once per mixed iteration);
/// decode step 10 ms + 1 ms per sequence.
/// Tier "A" (TTFT 200, TPOT 61, 100 in / 11 out): mixed iteration 10 + 2b ≤ 61 → b = 25 at
/// 60 ms → 25 / (0.06 s × 10 steps) = 41.67 rps per device; residence 172.4 + 600 ms (a new
/// prompt rides a 512-token chunk: (35 + 51.2) ms, waiting one iteration and then its own).
/// Tier "B" (TPOT 21): 10 + 2b ≤ 21 → b = 5 at 20 ms → 25 rps per device.
fn linear() -> Profile {
    Profile::from_json(
        r#"{"schema": "nitsum-profile/1", "device": "t", "model": "m", "tp_levels": [1],
        "prefill": {"1": [{"tokens": 1, "ms": 10.1}, {"tokens": 1001, "ms": 110.1}]},
        "decode": {"1": [{"batch": 1, "context": 10, "ms": 11}, {"batch": 64, "context": 10, "ms": 74}]}}"#,
    )
    .unwrap()
}

fn tier(name: &str, ttft: f64, tpot: f64) -> Tier {
    Tier {
        name: name.into(),
        ttft_ms: ttft,
        tpot_ms: tpot,
        weight: 1.0,
        background: false,
        max_inflight: None,
        max_tokens: None,
        reject_unattainable: false,
        preempt: true,
        bind_tp: None,
    }
}

fn demand(name: &str, rps: f64, prompt: f64, output: f64) -> TierDemand {
    TierDemand {
        tier: name.into(),
        rate_rps: rps,
        prompt: LengthStats::constant(prompt),
        output: LengthStats::constant(output),
    }
}

fn mixed_only() -> PlannerConfig {
    PlannerConfig {
        disaggregation: false,
        target_utilization: 1.0,
        ..PlannerConfig::default()
    }
}

/// Whether `g` is planned for exactly the tier named `name` in `tiers`.
fn only_for(g: &GroupPlan, tiers: &[Tier], name: &str) -> bool {
    matches!(g.tiers.as_slice(), [id] if tiers[id.index()].name == name)
}

fn count(plan: &Plan, tiers: &[Tier], tier: &str) -> usize {
    plan.groups
        .iter()
        .filter(|g| only_for(g, tiers, tier))
        .count()
}

#[test]
fn one_tier_takes_what_it_needs_and_leaves_the_rest_best_effort() {
    let tiers = [tier("A", 200.0, 61.0)];
    let out = plan(
        &linear(),
        &tiers,
        &[demand("A", 50.0, 100.0, 11.0)],
        4,
        None,
        &mixed_only(),
    );
    // 50 rps at 41.67 per device → 2 devices; 2 best-effort devices accept background.
    let g = &out.plan.groups;
    assert_eq!(count(&out.plan, &tiers, "A"), 2);
    assert!((g[0].max_rps - 125.0 / 3.0).abs() < 1e-6);
    assert!((g[0].max_inflight - 125.0 / 3.0 * 0.7724).abs() < 1e-6);
    assert_eq!(out.batch_caps, vec![25.0, 25.0, 0.0, 0.0]);
    assert!(g[2..]
        .iter()
        .all(|g| g.tiers.is_empty() && g.accepts_background));
    assert!(!g[0].accepts_background);
}

#[test]
fn two_tiers_compete_and_the_weight_prevents_starvation() {
    let tiers = [tier("A", 200.0, 61.0), tier("B", 200.0, 21.0)];
    let dem = [
        demand("A", 150.0, 100.0, 11.0),
        demand("B", 175.0, 100.0, 11.0),
    ];
    let run = |n| plan(&linear(), &tiers, &dem, n, None, &mixed_only()).plan;
    // Seeding gives A and B one device each; unmet (108.33, 150): A scores
    // 41.67·108.33/258.33 = 17.5 against B's 25·150/258.33 = 14.5, so A gets the third.
    let three = run(3);
    assert_eq!(
        (count(&three, &tiers, "A"), count(&three, &tiers, "B")),
        (2, 1)
    );
    // Fourth device: unmet (66.67, 150) → A 41.67·66.67/216.67 = 12.8, B 25·150/216.67 = 17.3:
    // the less efficient tier wins because its unmet share is larger, although A could still
    // use a whole device (demand-capped efficiency alone would pick A: 41.67 vs 25).
    let four = run(4);
    assert_eq!(
        (count(&four, &tiers, "A"), count(&four, &tiers, "B")),
        (2, 2)
    );
    // No leftover: every SLO group also takes background work.
    assert!(four.groups.iter().all(|g| g.accepts_background));
}

#[test]
fn previous_plan_is_kept_while_it_serves_the_demand() {
    let tiers = [tier("A", 200.0, 61.0)];
    let cfg = mixed_only();
    let at = |rps: f64, prev: Option<&Plan>| {
        plan(
            &linear(),
            &tiers,
            &[demand("A", rps, 100.0, 11.0)],
            4,
            prev,
            &cfg,
        )
        .plan
    };
    let first = at(50.0, None);
    assert_eq!(count(&first, &tiers, "A"), 2);
    // 2 × 41.67 = 83.33 rps of capacity; keep while demand ≤ 0.9 × 83.33 = 75.
    let low = at(10.0, Some(&first));
    assert_eq!((low.groups.clone(), low.epoch), (first.groups.clone(), 2));
    assert_eq!(count(&at(10.0, None), &tiers, "A"), 1);
    // 100 rps no longer fits: re-plan to 3 devices.
    assert_eq!(count(&at(100.0, Some(&first)), &tiers, "A"), 3);
}

#[test]
fn infeasible_tier_and_background_tier_get_no_reserved_groups() {
    let mut bg = tier("bg", 1.0, 1.0);
    bg.background = true;
    let tiers = [tier("A", 200.0, 61.0), tier("X", 200.0, 5.0), bg];
    let dem = [
        demand("A", 10.0, 100.0, 11.0),
        demand("X", 10.0, 100.0, 11.0),
        demand("bg", 50.0, 100.0, 11.0),
    ];
    let out = plan(&linear(), &tiers, &dem, 3, None, &mixed_only()).plan;
    assert_eq!(
        (
            count(&out, &tiers, "A"),
            count(&out, &tiers, "X"),
            count(&out, &tiers, "bg")
        ),
        (1, 0, 0)
    );
    assert_eq!(out.groups.iter().filter(|g| g.tiers.is_empty()).count(), 2);
}

// ---- property tests over random inputs (a small LCG keeps them dependency-free) ----

struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

/// TP {1,2,4,8}: prefill scales ~1/t, decode step is cheaper per sequence at higher TP.
pub(crate) fn four_level() -> Profile {
    let mut prefill = Vec::new();
    let mut decode = Vec::new();
    for t in [1.0f64, 2.0, 4.0, 8.0] {
        prefill.push(format!(
            r#""{t}": [{{"tokens": 1, "ms": {a}}}, {{"tokens": 8192, "ms": {b}}}]"#,
            a = 5.0 + t,
            b = 5.0 + t + 400.0 / t
        ));
        decode.push(format!(
            r#""{t}": [{{"batch": 1, "context": 128, "ms": {a}}}, {{"batch": 256, "context": 128, "ms": {b}}},
                   {{"batch": 1, "context": 4096, "ms": {c}}}, {{"batch": 256, "context": 4096, "ms": {d}}}]"#,
            a = 8.0 / t + 0.5 * t,
            b = 40.0 / t + 0.5 * t,
            c = 9.0 / t + 0.5 * t,
            d = 120.0 / t + 0.5 * t
        ));
    }
    Profile::from_json(&format!(
        r#"{{"schema": "nitsum-profile/1", "device": "t", "model": "m", "tp_levels": [1, 2, 4, 8],
        "prefill": {{{}}}, "decode": {{{}}}}}"#,
        prefill.join(","),
        decode.join(",")
    ))
    .unwrap()
}

fn check_well_formed(plan: &Plan, n: u32) {
    let mut used = vec![false; n as usize];
    for g in &plan.groups {
        assert_eq!(g.tp as usize, g.members.len());
        assert_eq!(g.leader() % g.tp, 0, "unaligned {g:?}");
        for (k, &m) in g.members.iter().enumerate() {
            assert_eq!(m, g.leader() + k as u32, "not contiguous {g:?}");
            assert!(m < n, "device {m} of {n}");
            assert!(!used[m as usize], "device {m} in two groups");
            used[m as usize] = true;
        }
    }
}

fn random_case(rng: &mut Lcg) -> (Vec<Tier>, Vec<TierDemand>, u32) {
    let k = rng.range(1, 8) as usize;
    let tiers: Vec<Tier> = (0..k)
        .map(|i| {
            tier(
                &format!("t{i}"),
                rng.range(300, 5000) as f64,
                rng.range(30, 200) as f64,
            )
        })
        .collect();
    let dem = tiers
        .iter()
        .map(|t| {
            let rate = if rng.range(0, 4) == 0 {
                0.0
            } else {
                rng.range(1, 500) as f64
            };
            // NOTE: ranges keep every tier feasible on one TP1 mixed device (see the fairness
            // property below): ≥ 32 output tokens spread the prompt over many iterations.
            demand(
                &t.name,
                rate,
                rng.range(16, 2048) as f64,
                rng.range(32, 512) as f64,
            )
        })
        .collect();
    (tiers, dem, rng.range(1, 80) as u32)
}

#[test]
fn property_plans_are_well_formed_fair_and_stable() {
    let profile = four_level();
    let cfg = PlannerConfig::default();
    let mut rng = Lcg(7);
    for _ in 0..300 {
        let (tiers, dem, n) = random_case(&mut rng);
        let first = plan(&profile, &tiers, &dem, n, None, &cfg);
        check_well_formed(&first.plan, n);
        assert_eq!(first.batch_caps.len(), first.plan.groups.len());
        let wanting = dem.iter().filter(|d| d.rate_rps > 0.0).count();
        if n as usize >= tiers.len() {
            for d in dem.iter().filter(|d| d.rate_rps > 0.0) {
                assert!(
                    first
                        .plan
                        .groups
                        .iter()
                        .any(|g| only_for(g, &tiers, &d.tier)),
                    "tier {} starved: {n} devices, {wanting} tiers with demand",
                    d.tier
                );
            }
        }
        // Same input + previous plan → same groups, nothing moves.
        let again = plan(&profile, &tiers, &dem, n, Some(&first.plan), &cfg);
        assert_eq!(again.plan.groups, first.plan.groups);
        assert_eq!(again.plan.epoch, first.plan.epoch + 1);
        // A different demand, planned on top of the first plan, is still well formed.
        let (_, dem2, _) = random_case(&mut rng);
        let renamed: Vec<TierDemand> = dem2
            .into_iter()
            .zip(&tiers)
            .map(|(mut d, t)| {
                d.tier = t.name.clone();
                d
            })
            .collect();
        let next = plan(&profile, &tiers, &renamed, n, Some(&first.plan), &cfg);
        check_well_formed(&next.plan, n);
    }
}

#[test]
fn restricting_to_one_level_is_the_static_tp_ablation() {
    let profile = four_level();
    let cfg = PlannerConfig {
        tp_levels: Some(vec![2]),
        ..PlannerConfig::default()
    };
    let (tiers, dem, _) = random_case(&mut Lcg(3));
    let out = plan(&profile, &tiers, &dem, 16, None, &cfg);
    check_well_formed(&out.plan, 16);
    assert!(out.plan.groups.iter().all(|g: &GroupPlan| g.tp == 2));
    assert_eq!(out.plan.groups.len(), 8);
}

#[test]
fn tier_only_disaggregation_serves_gets_a_bundle_that_fits() {
    // Prefill is costly per token, so a mixed iteration carrying a 512-token chunk misses
    // the strict TTFT at both levels; 40-token prompts still prefill alone well within it.
    // The most efficient bundle over all level pairs needs more than 4 devices: the planner
    // must still find one that fits instead of leaving the tier without a group.
    let profile = Profile::from_json(
        r#"{"schema": "nitsum-profile/1", "device": "t", "model": "m", "tp_levels": [1, 2],
        "prefill": {"1": [{"tokens": 1, "ms": 10.3}, {"tokens": 1001, "ms": 310.3}],
                    "2": [{"tokens": 1, "ms": 6.25}, {"tokens": 1001, "ms": 256.25}]},
        "decode": {"1": [{"batch": 1, "context": 64, "ms": 20}, {"batch": 128, "context": 64, "ms": 147}],
                   "2": [{"batch": 1, "context": 64, "ms": 12}, {"batch": 128, "context": 64, "ms": 88.2}]}}"#,
    )
    .unwrap();
    let tiers = [tier("strict", 250.0, 25.0)];
    let cfg = PlannerConfig {
        keep_utilization: 0.0,
        ..PlannerConfig::default()
    };
    assert!(efficiency::mixed(&profile, 1, &shape_of(&tiers[0], 40.0, 8.0), 512.0).is_none());
    assert!(efficiency::mixed(&profile, 2, &shape_of(&tiers[0], 40.0, 8.0), 512.0).is_none());
    for rate in [1.0, 20.0, 300.0] {
        let out = plan(
            &profile,
            &tiers,
            &[demand("strict", rate, 40.0, 8.0)],
            4,
            None,
            &cfg,
        );
        check_well_formed(&out.plan, 4);
        let roles: Vec<Role> = out
            .plan
            .groups
            .iter()
            .filter(|g| only_for(g, &tiers, "strict"))
            .map(|g| g.role)
            .collect();
        assert!(
            roles.contains(&Role::Prefill) && roles.contains(&Role::Decode),
            "rate {rate}: {:?}",
            out.plan.groups
        );
    }
}

fn shape_of(t: &Tier, prompt: f64, output: f64) -> efficiency::TierShape {
    efficiency::TierShape::new(t, &demand(&t.name, 1.0, prompt, output))
}

#[test]
fn under_overload_a_new_plan_must_serve_clearly_more_to_replace_the_old() {
    let tiers = [tier("A", 200.0, 61.0)];
    // 41.67 rps per TP-1 device; 500 rps is far beyond 4 devices.
    let dem = [demand("A", 500.0, 100.0, 11.0)];
    let cfg = mixed_only();
    let three = plan(
        &linear(),
        &tiers,
        &[demand("A", 100.0, 100.0, 11.0)],
        3,
        None,
        &cfg,
    )
    .plan;
    let mut prev = three.clone();
    prev.groups.push(GroupPlan {
        members: vec![3],
        tp: 1,
        pp: 1,
        role: Role::Mixed,
        tiers: Vec::new(),
        accepts_background: true,
        max_rps: 0.0,
        max_inflight: 0.0,
    });
    assert_eq!(count(&prev, &tiers, "A"), 3);
    // The fresh plan gives A all 4 devices: 4/3 of the old capacity, a gain > 10%: switch.
    let out = plan(&linear(), &tiers, &dem, 4, Some(&prev), &cfg);
    assert_eq!(count(&out.plan, &tiers, "A"), 4);
    // Asking for more than a 50% gain keeps the old layout (capacities refreshed).
    let strict = PlannerConfig {
        switch_gain: 0.5,
        ..mixed_only()
    };
    let kept = plan(&linear(), &tiers, &dem, 4, Some(&prev), &strict);
    assert_eq!(count(&kept.plan, &tiers, "A"), 3);
    assert_eq!(kept.plan.epoch, prev.epoch + 1);
    assert!((kept.plan.groups[0].max_rps - 125.0 / 3.0).abs() < 1e-6);
}

/// TP 1 and 2 as `linear` (TP 2 no faster than TP 1), and a pipeline of two TP-1 stages
/// ("1x2") whose steps cost half as much: under tier A's TPOT a TP-1 group batches 5 (25 rps
/// a device), the pipeline 16 (about 38 rps a device).
fn with_pipeline(pipelines: bool) -> Profile {
    let pp = if pipelines {
        r#", "pipelines": ["1x2"],
        "pp_prefill": {"1x2": [{"tokens": 1, "ms": 5.05}, {"tokens": 1001, "ms": 55.05}]},
        "pp_decode": {"1x2": [{"batch": 1, "context": 10, "ms": 5.5}, {"batch": 64, "context": 10, "ms": 37}]}"#
    } else {
        ""
    };
    Profile::from_json(&format!(
        r#"{{"schema": "nitsum-profile/1", "device": "t", "model": "m", "tp_levels": [1, 2],
        "prefill": {{"1": [{{"tokens": 1, "ms": 10.1}}, {{"tokens": 1001, "ms": 110.1}}],
                     "2": [{{"tokens": 1, "ms": 10.1}}, {{"tokens": 1001, "ms": 110.1}}]}},
        "decode": {{"1": [{{"batch": 1, "context": 10, "ms": 11}}, {{"batch": 64, "context": 10, "ms": 74}}],
                    "2": [{{"batch": 1, "context": 10, "ms": 11}}, {{"batch": 64, "context": 10, "ms": 74}}]}}
        {pp}}}"#
    ))
    .unwrap()
}

#[test]
fn the_planner_picks_a_pipeline_when_the_profile_makes_it_the_most_efficient() {
    let tiers = [tier("A", 1000.0, 21.0)];
    let d = [demand("A", 1000.0, 100.0, 11.0)];
    let out = plan(&with_pipeline(true), &tiers, &d, 4, None, &mixed_only());
    let shapes: Vec<(u32, u32, usize)> = out
        .plan
        .groups
        .iter()
        .map(|g| (g.tp, g.pp, g.members.len()))
        .collect();
    assert_eq!(shapes, vec![(1, 2, 2), (1, 2, 2)], "{:?}", out.plan.groups);
    assert_eq!(out.plan.groups[1].members, vec![2, 3]);
    // The reconfigure message carries the shape; a TP-only plan omits `pp`.
    let wire: serde_json::Value = rmp_serde::from_slice(
        &crate::protocols::worker::encode_reconfigure(&out.plan, &tiers, |_| None),
    )
    .unwrap();
    assert_eq!(
        (
            wire["groups"][0]["tp"].as_u64(),
            wire["groups"][0]["pp"].as_u64()
        ),
        (Some(1), Some(2))
    );
    // Without the pipeline in the profile: TP groups only.
    let out = plan(&with_pipeline(false), &tiers, &d, 4, None, &mixed_only());
    assert!(out.plan.groups.iter().all(|g| g.pp == 1));
    // A static strategy (`tp_levels` set) never plans pipelines.
    let fixed = PlannerConfig {
        tp_levels: Some(vec![1]),
        ..mixed_only()
    };
    let out = plan(&with_pipeline(true), &tiers, &d, 4, None, &fixed);
    assert!(out.plan.groups.iter().all(|g| g.pp == 1 && g.tp == 1));
}

/// Two host worker processes of 2 devices each, all on one KV transport or none: the pool
/// shape the router derives from their `register`s.
fn two_hosts(transport: Option<&str>) -> crate::registry::PoolShape {
    use crate::ids::WorkerId;
    use crate::registry::{Registry, WorkerInfo};
    let mut r = Registry::default();
    for id in 0..4u32 {
        let info = WorkerInfo {
            tp_levels: vec![1, 2, 4],
            domain: Some(id / 2 * 2),
            kv_transport: transport.map(str::to_owned),
            ..WorkerInfo::default()
        };
        r.register(
            WorkerId(id),
            bytes::Bytes::new(),
            info,
            std::time::Instant::now(),
        );
    }
    r.pool_shape()
}

#[test]
fn linked_hosts_get_a_pd_bundle_across_them_and_no_tp_group_spans_two() {
    // The profile of `tier_only_disaggregation_serves_gets_a_bundle_that_fits`: only a P/D
    // bundle meets the strict tier (a mixed group at either level misses its TTFT).
    let profile = Profile::from_json(
        r#"{"schema": "nitsum-profile/1", "device": "t", "model": "m", "tp_levels": [1, 2, 4],
        "prefill": {"1": [{"tokens": 1, "ms": 10.3}, {"tokens": 1001, "ms": 310.3}],
                    "2": [{"tokens": 1, "ms": 6.25}, {"tokens": 1001, "ms": 256.25}],
                    "4": [{"tokens": 1, "ms": 4.0}, {"tokens": 1001, "ms": 200.0}]},
        "decode": {"1": [{"batch": 1, "context": 64, "ms": 20}, {"batch": 128, "context": 64, "ms": 147}],
                   "2": [{"batch": 1, "context": 64, "ms": 12}, {"batch": 128, "context": 64, "ms": 88.2}],
                   "4": [{"batch": 1, "context": 64, "ms": 8}, {"batch": 128, "context": 64, "ms": 60}]}}"#,
    )
    .unwrap();
    let tiers = [tier("strict", 250.0, 25.0)];
    let base = PlannerConfig {
        keep_utilization: 0.0,
        ..PlannerConfig::default()
    };
    let host = |d: u32| d / 2; // devices 0-1 on host 0, 2-3 on host 1
    let linked = two_hosts(Some("tcp://10.0.0.1:29600"));
    assert_eq!(
        (linked.tp_levels.clone(), linked.kv_linked),
        (vec![1, 2], true)
    );
    let cfg = base.for_pool(&linked.tp_levels, linked.kv_linked);
    let out = plan(
        &profile,
        &tiers,
        &[demand("strict", 300.0, 40.0, 8.0)],
        4,
        None,
        &cfg,
    );
    check_well_formed(&out.plan, 4);
    let groups = &out.plan.groups;
    // No TP group spans two hosts (TP 4 would: it is not among the pool's levels).
    for g in groups {
        assert!(
            g.members.iter().all(|&m| host(m) == host(g.members[0])),
            "{groups:?}"
        );
    }
    // A prefill group on one host and a decode group on the other serve the tier.
    let hosts_of = |role: Role| -> Vec<u32> {
        groups
            .iter()
            .filter(|g| g.role == role && only_for(g, &tiers, "strict"))
            .map(|g| host(g.members[0]))
            .collect()
    };
    let (prefill, decode) = (hosts_of(Role::Prefill), hosts_of(Role::Decode));
    assert!(
        prefill.iter().any(|p| decode.iter().any(|d| d != p)),
        "no P/D bundle across the hosts: {groups:?}"
    );
    // The same hosts without a KV transport: no P/D at all (every group mixed).
    let apart = two_hosts(None);
    assert!(!apart.kv_linked);
    let cfg = base.for_pool(&apart.tp_levels, apart.kv_linked);
    let out = plan(
        &profile,
        &tiers,
        &[demand("strict", 300.0, 40.0, 8.0)],
        4,
        None,
        &cfg,
    );
    assert!(
        out.plan.groups.iter().all(|g| g.role == Role::Mixed),
        "{:?}",
        out.plan.groups
    );
}

#[test]
fn demand_resolves_to_tier_positions_once_per_plan() {
    let tiers = [tier("A", 200.0, 61.0), tier("B", 200.0, 61.0)];
    // "B" twice (the last counts, as a map by name kept it), "gone" not in the list, no "A".
    let dem = [
        demand("B", 1.0, 10.0, 1.0),
        demand("gone", 5.0, 10.0, 1.0),
        demand("B", 2.0, 10.0, 1.0),
    ];
    let rates: Vec<Option<f64>> = super::score::demand_by_tier(&tiers, &dem)
        .iter()
        .map(|d| d.map(|d| d.rate_rps))
        .collect();
    assert_eq!(rates, [None, Some(2.0)]);
}
