//! The lookahead's predictor against the simulated engine (calibration), the choice's
//! no-regret property, and hysteresis on a stationary workload.

use super::*;
use crate::profile::ProfileFile;
use crate::sim::chooser::Chooser;
use crate::sim::simulate;
use crate::stats::LengthStats;

const H100: &str = include_str!("../../../profiles/h100-llama3-8b-analytic.json");

pub(crate) fn profile_file() -> ProfileFile {
    serde_json::from_str(H100).unwrap()
}

/// The Azure-conv tiers of docs/results.md (paper method on the analytic H100 profile).
pub(crate) fn tiers() -> Vec<Tier> {
    serde_json::from_str(
        r#"[{"name": "strict", "ttft_ms": 98.7, "tpot_ms": 9.53},
            {"name": "relaxed", "ttft_ms": 120.2, "tpot_ms": 21.27}]"#,
    )
    .unwrap()
}

/// Conv-like lengths (mean prompt 1155, mean output 211) at `rate` req/s per tier.
pub(crate) fn demand(strict: f64, relaxed: f64) -> Vec<TierDemand> {
    let stats = |mean: f64| LengthStats {
        count: 1000,
        mean,
        p50: mean * 0.7,
        p90: mean * 2.0,
        p99: mean * 4.0,
    };
    [("strict", strict), ("relaxed", relaxed)]
        .into_iter()
        .map(|(t, r)| TierDemand {
            tier: t.into(),
            rate_rps: r,
            prompt: stats(1155.0),
            output: stats(211.0),
        })
        .collect()
}

pub(crate) fn planner_cfg() -> PlannerConfig {
    PlannerConfig {
        slo_margin: 0.9,
        ..PlannerConfig::default()
    }
}

/// The forecast lookahead, as these tests were written for (the default is the shadow choice).
fn forecast_cfg() -> LookaheadConfig {
    LookaheadConfig {
        choice: ChoiceKind::Forecast,
        eval_devices: 8,
        ..LookaheadConfig::default()
    }
}

pub(crate) fn knobs() -> EngineKnobs {
    EngineKnobs {
        window_s: 1.0,
        switch_ms: 5.0,
        kv_bytes_per_token: 131_072.0,
        kv_bandwidth_gbps: 100.0,
        chunk_tokens: 512,
        prefill_budget_tokens: 8192,
        binding: Default::default(),
    }
}

/// A stationary trace with `demand`'s statistics (an independent draw: seed ≠ the forecast's).
pub(crate) fn trace(d: &[TierDemand], seconds: f64, seed: u64) -> Vec<TraceRequest> {
    let spec = ForecastSpec {
        horizon_s: seconds,
        rate_factor: 1.0,
        replay: false,
        history_s: f64::INFINITY,
        scale: 1.0,
        prior_lengths: (1024.0, 256.0),
        seed,
    };
    forecast(&tiers(), d, &[], &[], &spec)
}

pub(crate) fn sim_config(policy: Policy, devices: u32, requests: Vec<TraceRequest>) -> SimConfig {
    let k = knobs();
    SimConfig {
        profile: profile_file(),
        tiers: tiers(),
        devices,
        policy,
        requests,
        window_s: 1.0,
        switch_ms: k.switch_ms,
        kv_bytes_per_token: k.kv_bytes_per_token,
        kv_bandwidth_gbps: k.kv_bandwidth_gbps,
        chunk_tokens: k.chunk_tokens,
        prefill_budget_tokens: k.prefill_budget_tokens,
        drain_s: 60.0,
        records: false,
        slo_margin: 0.9,
        target_utilization: planner_cfg().target_utilization,
        lookahead: LookaheadConfig::default(),
        binding: Default::default(),
        seed: 0,
    }
}

/// A situation with no requests in flight and no recent arrivals (the Poisson forecast).
fn bare_situation<'a>(
    profile: &'a Profile,
    tiers: &'a [Tier],
    demand: &'a [TierDemand],
    devices: u32,
    levels: &'a [u32],
    planner: &'a PlannerConfig,
) -> Situation<'a> {
    Situation {
        profile,
        tiers,
        demand,
        inflight: &[],
        recent: &[],
        history_s: 0.0,
        devices,
        levels,
        planner,
        knobs: knobs(),
    }
}

/// (predicted, delivered) goodput of every strategy on `devices` under `d`: the predictor's
/// candidate (first round, no switch cost) vs the strategy's plan run as a fixed plan on a
/// 60 s independent trace of the same statistics.
fn calibration(d: &[TierDemand], devices: u32) -> Vec<(String, f64, f64)> {
    let (pf, t, pc) = (profile_file(), tiers(), planner_cfg());
    let profile = Profile::from_file(pf.clone()).unwrap();
    let levels = crate::planner::candidate_levels(&profile, &pc, devices);
    let situation = bare_situation(&profile, &t, d, devices, &levels, &pc);
    let strategies = Strategy::all(&levels);
    let every = vec![true; strategies.len()];
    let predicted = predict_all(&situation, &forecast_cfg(), None, &every);
    let requests = trace(d, 60.0, 7);
    strategies
        .iter()
        .zip(predicted)
        .map(|(&s, p)| {
            let planned = plan_strategy(s, &profile, &t, d, devices, None, &pc);
            let policy = Policy::FixedPlan {
                plan: planned.plan.named(&t),
                batch_caps: planned.batch_caps,
                reject_best_effort: false,
            };
            let r = simulate(&sim_config(policy, devices, requests.clone())).unwrap();
            (s.name(), p.unwrap().goodput_rps, r.met as f64 / 60.0)
        })
        .collect()
}

fn assert_calibrated(rows: &[(String, f64, f64)], rel: f64, floor_rps: f64) {
    for (name, predicted, delivered) in rows {
        let bound = (rel * delivered).max(floor_rps);
        assert!(
            (predicted - delivered).abs() <= bound,
            "{name}: predicted {predicted:.1} req/s, delivered {delivered:.1} (bound ±{bound:.1}); all: {rows:?}"
        );
    }
}

#[test]
fn calibration_every_family_predicts_what_the_engine_delivers_below_saturation() {
    // 8 devices, no thinning: mixed TP 1/2/4/8 (fixed and static), the greedy, Split.
    let rows = calibration(&demand(20.0, 20.0), 8);
    assert_calibrated(&rows, 0.15, 1.0);
}

#[test]
fn calibration_holds_on_a_thinned_pool_under_overload() {
    // 32 devices simulated as 8 (scale 1/4), offered well past what any layout serves.
    let rows = calibration(&demand(200.0, 200.0), 32);
    let (fcfs, admitted): (Vec<_>, Vec<_>) =
        rows.into_iter().partition(|r| r.0.starts_with("static"));
    // NOTE: since the local scheduler demotes prompts that cannot make their TTFT (engine.rs,
    // `demote_hopeless`), the 4 s prediction from an empty pool over-rates mixed TP 1 (long prompts queue up over longer than the horizon: +19%,
    // 270 vs 228 req/s); the others are within -9%..-4%.
    assert_calibrated(&admitted, 0.2, 4.0);
    // NOTE (known limit): SLO-agnostic FCFS collapses progressively under overload, over
    // longer than the horizon; the predictor over-rates it there (TP 1 +27%, TP 8 ~10× on
    // this workload) but never under-rates it. The choice's `switch_margin` is what keeps
    // such a candidate from winning on a thin lead.
    for (name, predicted, delivered) in &fcfs {
        assert!(
            predicted >= &(0.85 * delivered),
            "{name}: {predicted} vs {delivered}"
        );
    }
}

#[test]
fn the_choice_never_predicts_less_than_keeping_the_current_strategy() {
    let (pf, t, pc) = (profile_file(), tiers(), planner_cfg());
    let profile = Profile::from_file(pf.clone()).unwrap();
    let levels = crate::planner::candidate_levels(&profile, &pc, 16);
    let cfg = forecast_cfg();
    for (strict, relaxed) in [(5.0, 60.0), (60.0, 5.0), (40.0, 40.0), (150.0, 150.0)] {
        let d = demand(strict, relaxed);
        let situation = bare_situation(&profile, &t, &d, 16, &levels, &pc);
        for current in Strategy::all(&levels) {
            let mut chooser = Chooser::new(cfg.clone(), current);
            let choice = chooser.round(&situation, 0.0, &|_, _| 0.0);
            let score = |s: Strategy| {
                choice
                    .candidates
                    .iter()
                    .find(|c| c.strategy == s.name())
                    .unwrap()
                    .smoothed_rps
            };
            assert!(score(choice.chosen) >= score(current), "{choice:?}");
            if choice.chosen != current {
                assert!(
                    score(choice.chosen) > score(current) * (1.0 + cfg.switch_margin),
                    "switched within the margin: {choice:?}"
                );
                assert!(choice.reason.starts_with("switched"), "{}", choice.reason);
            }
            // The winner is the best net prediction, or the current one within the margin.
            let best = choice
                .candidates
                .iter()
                .map(|c| c.smoothed_rps)
                .fold(f64::MIN, f64::max);
            assert!(score(choice.chosen) * (1.0 + cfg.switch_margin) >= best);
        }
    }
}

#[test]
fn a_round_predicts_the_strategy_in_force_and_rotates_the_rivals() {
    let (pf, t, pc) = (profile_file(), tiers(), planner_cfg());
    let profile = Profile::from_file(pf).unwrap();
    let levels = crate::planner::candidate_levels(&profile, &pc, 16);
    let n = Strategy::all(&levels).len();
    for rivals in [0u32, 2] {
        let cfg = LookaheadConfig {
            rivals_per_round: rivals,
            ..forecast_cfg()
        };
        let mut chooser = Chooser::new(cfg, Strategy::Greedy);
        let mut last_fresh = vec![0usize; n];
        for round in 1..=12usize {
            // The mix swings between rounds, so the predictions (and the leader) move.
            let d = if round % 2 == 0 {
                demand(60.0, 10.0)
            } else {
                demand(10.0, 60.0)
            };
            let situation = bare_situation(&profile, &t, &d, 16, &levels, &pc);
            let in_force = chooser.current();
            let choice = chooser.round(&situation, round as f64, &|_, _| 0.0);
            assert_eq!(choice.candidates.len(), n);
            let fresh: Vec<bool> = choice.candidates.iter().map(|c| c.fresh).collect();
            let at = |s: Strategy| {
                choice
                    .candidates
                    .iter()
                    .position(|c| c.strategy == s.name())
            };
            assert!(
                fresh[at(in_force).unwrap()],
                "the strategy in force is predicted"
            );
            assert!(
                fresh[at(choice.chosen).unwrap()],
                "a stale candidate won: {choice:?}"
            );
            if rivals == 0 || round == 1 {
                assert!(fresh.iter().all(|&f| f), "round {round}: {fresh:?}");
            } else {
                // Strategies sharing a plan with a predicted one are predicted with it.
                let predicted = fresh.iter().filter(|&&f| f).count();
                assert!(predicted < n, "round {round}: every candidate predicted");
            }
            for (k, &f) in fresh.iter().enumerate() {
                if f {
                    last_fresh[k] = round;
                } else {
                    assert!(
                        round - last_fresh[k] < n,
                        "candidate {k} starved at {round}"
                    );
                }
            }
        }
    }
}

#[test]
fn a_stationary_workload_settles_and_stops_reconfiguring() {
    let requests = trace(&demand(25.0, 25.0), 40.0, 11);
    let r = simulate(&sim_config(Policy::Adaptive, 8, requests)).unwrap();
    let late: Vec<_> = r.timeline.iter().filter(|(t, _)| *t > 5.0).collect();
    assert!(late.is_empty(), "re-planned after warm-up: {late:?}");
    // Every window ran a selection round, each with every strategy and a reason.
    assert!(r.choices.len() >= 35, "{}", r.choices.len());
    for (_, c) in &r.choices {
        assert_eq!(c.candidates.len(), 10);
        assert!(!c.reason.is_empty());
    }
    assert!(r.attainment > 0.9, "{}", r.attainment);
}

#[test]
fn a_strategy_that_delivers_less_than_predicted_is_discounted_and_left() {
    let (pf, t, pc) = (profile_file(), tiers(), planner_cfg());
    let profile = Profile::from_file(pf).unwrap();
    let levels = crate::planner::candidate_levels(&profile, &pc, 8);
    let d = demand(20.0, 20.0);
    let situation = bare_situation(&profile, &t, &d, 8, &levels, &pc);
    let cfg = LookaheadConfig {
        bias_rate: 0.3,
        ..forecast_cfg()
    };
    let mut chooser = Chooser::new(cfg, Strategy::Greedy);
    // The run delivers nothing while the greedy is in force: once a round's requests had
    // time to finish (3 horizons), its predictions are scaled down until another wins.
    let mut first_bias = None;
    let mut left_at = None;
    for k in 0..40 {
        let now = f64::from(k);
        let greedy = chooser.current() == Strategy::Greedy;
        let choice = chooser.round(&situation, now, &|_, _| if greedy { 0.0 } else { 40.0 });
        let bias = |name: &str| {
            choice
                .candidates
                .iter()
                .find(|c| c.strategy == name)
                .unwrap()
                .bias
        };
        if now < 12.0 {
            assert_eq!(bias("greedy"), 1.0, "nothing is checked before 3 horizons");
        } else if first_bias.is_none() {
            first_bias = Some(bias("greedy"));
        }
        if choice.chosen != Strategy::Greedy && left_at.is_none() {
            left_at = Some(now);
            assert!(
                choice.reason.starts_with("switched greedy"),
                "{}",
                choice.reason
            );
        }
    }
    assert!(first_bias.unwrap() < 0.9, "{first_bias:?}");
    assert!(left_at.is_some_and(|t| t >= 12.0), "{left_at:?}");
}

#[test]
fn every_windows_spaces_the_rounds_and_unknown_knobs_are_refused() {
    let requests = trace(&demand(25.0, 25.0), 20.0, 11);
    let mut cfg = sim_config(Policy::Adaptive, 8, requests);
    let every = simulate(&cfg).unwrap().choices.len();
    cfg.lookahead.every_windows = 4;
    let spaced = simulate(&cfg).unwrap().choices;
    assert!(
        every >= 20 && spaced.len() <= every.div_ceil(4),
        "{every} vs {}",
        spaced.len()
    );
    assert!(spaced.windows(2).all(|w| w[1].0 - w[0].0 >= 4.0 - 1e-9));
    let e = serde_json::from_str::<LookaheadConfig>(r#"{"horizon": 3}"#).unwrap_err();
    assert!(e.to_string().contains("unknown field `horizon`"), "{e}");
}

#[test]
fn a_switch_costs_the_same_share_of_goodput_on_any_pool_size() {
    // The same per-device load (demand and decoding requests) on 8 and on 64 devices: each
    // new group receives its own devices' KV, in parallel with the others, so moving every
    // device costs the same share of the predicted goodput whatever the pool size.
    let (pf, t, pc) = (profile_file(), tiers(), planner_cfg());
    let profile = Profile::from_file(pf).unwrap();
    let share = |devices: u32| {
        let per = f64::from(devices) / 8.0;
        let d = demand(20.0 * per, 20.0 * per);
        let levels = crate::planner::candidate_levels(&profile, &pc, devices);
        let inflight: Vec<InFlight> = (0..(200.0 * per) as usize)
            .map(|k| InFlight {
                tier: k % 2,
                generated: 50.0,
                age_s: 1.0,
                feasible: true,
            })
            .collect();
        let situation = Situation {
            inflight: &inflight,
            ..bare_situation(&profile, &t, &d, devices, &levels, &pc)
        };
        let cfg = forecast_cfg();
        let strategies = Strategy::all(&levels);
        let every = vec![true; strategies.len()];
        let candidates = predict_all(&situation, &cfg, Some(Strategy::StaticTp { tp: 1 }), &every);
        let at = strategies
            .iter()
            .position(|&s| s == Strategy::FixedTp { tp: 4 })
            .unwrap();
        let c = candidates[at].as_ref().unwrap();
        assert!(c.goodput_rps > 0.0, "{c:?}");
        c.switch_cost_rps / c.goodput_rps
    };
    let (small, large) = (share(8), share(64));
    assert!(
        small > 0.15,
        "a full switch costs at least move_penalty: {small}"
    );
    assert!(
        (large - small).abs() < 0.05,
        "8 devices {small:.3}, 64 {large:.3}"
    );
}
