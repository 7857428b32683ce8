//! The shadow choice: shadows measure what their strategy delivers (calibration), the choice
//! never ends below the best static layout on a stationary workload, a switch needs a
//! significant lead, and shadows forget what they resolved.

use super::*;
use crate::planner::candidate_levels;
use crate::planner::strategy::{self, Strategy};
use crate::profile::Profile;
use crate::sim::forecast::RecentArrival;
use crate::sim::lookahead::tests::{
    demand, knobs, planner_cfg, profile_file, sim_config, tiers, trace,
};
use crate::sim::lookahead::ChoiceKind;
use crate::sim::simulate;
use crate::stats::TierDemand;

/// Drive a bank as the control loop does: a round every second until `until`, each fed the
/// trace's arrivals of the last seconds. Returns the bank.
fn run_bank(
    requests: &[TraceRequest],
    d: &[TierDemand],
    devices: u32,
    cfg: &LookaheadConfig,
    until: f64,
) -> ShadowBank {
    let profile = Profile::from_file(profile_file()).unwrap();
    let (t, pc) = (tiers(), planner_cfg());
    let levels = candidate_levels(&profile, &pc, devices);
    let mut bank: Option<ShadowBank> = None;
    let mut now = 1.0;
    while now <= until {
        let recent: Vec<RecentArrival> = requests
            .iter()
            .filter(|r| r.arrival_s <= now && r.arrival_s > now - cfg.lookback_s())
            .map(|r| RecentArrival {
                tier: t.iter().position(|x| x.name == r.tier).unwrap(),
                age_s: now - r.arrival_s,
                prompt: f64::from(r.input_len),
            })
            .collect();
        let s = Situation {
            profile: &profile,
            tiers: &t,
            demand: d,
            inflight: &[],
            recent: &recent,
            history_s: now,
            devices,
            levels: &levels,
            planner: &pc,
            knobs: knobs(),
        };
        let b = bank.get_or_insert_with(|| ShadowBank::new(&s, cfg, now - 1.5).unwrap());
        b.advance(&s, cfg, now);
        now += 1.0;
    }
    bank.unwrap()
}

/// The simulated run of `st` on the whole pool (what its shadow stands for), as a policy.
fn policy_of(st: Strategy, devices: u32) -> Option<Policy> {
    Some(match st {
        Strategy::Greedy => Policy::Fixed(Strategy::Greedy),
        Strategy::FixedTp { tp } => Policy::Fixed(Strategy::FixedTp { tp }),
        Strategy::StaticTp { tp } => {
            let planned = strategy::static_tp(&tiers(), devices, tp, None);
            Policy::FixedPlan {
                plan: planned.plan.named(&tiers()),
                batch_caps: planned.batch_caps,
                reject_best_effort: false,
            }
        }
        // Split re-plans its partitions every window: no whole-run policy is the same.
        Strategy::Split => return None,
    })
}

/// (strategy, shadow attainment, attainment of the strategy's own run) for every strategy.
fn calibration(d: &[TierDemand], devices: u32, seconds: f64) -> Vec<(String, f64, f64)> {
    let requests = trace(d, seconds, 7);
    let cfg = LookaheadConfig {
        eval_devices: 8,
        memory_s: 1e9, // no decay: the whole run
        ..LookaheadConfig::default()
    };
    let bank = run_bank(&requests, d, devices, &cfg, seconds + 15.0);
    let st = bank.standing().clone();
    bank.strategies
        .iter()
        .enumerate()
        .filter_map(|(k, &s)| {
            let run = simulate(&sim_config(
                policy_of(s, devices)?,
                devices,
                requests.clone(),
            ));
            Some((s.name(), st.met[k] / st.total, run.unwrap().attainment))
        })
        .collect()
}

/// NOTE: relative to what was delivered, but at least `rel` × 0.15: below 15% attainment a
/// relative bound is ill-conditioned (at 0.11, 15% is 1.7 points of attainment).
fn assert_calibrated(rows: &[(String, f64, f64)], rel: f64) {
    for (name, shadow, delivered) in rows {
        assert!(
            (shadow - delivered).abs() <= rel * delivered.max(0.15),
            "{name}: shadow {shadow:.3} vs delivered {delivered:.3} (±{rel}); all: {rows:?}"
        );
    }
}

#[test]
fn a_shadow_measures_what_its_strategy_delivers_below_saturation() {
    // 8 devices, the shadows are whole copies; only the output lengths are drawn.
    let rows = calibration(&demand(20.0, 20.0), 8, 60.0);
    assert_eq!(rows.len(), 9);
    assert_calibrated(&rows, 0.15);
}

#[test]
fn a_thinned_shadow_measures_what_its_strategy_delivers_under_overload() {
    // 32 devices, shadows of 8 fed a quarter of the arrivals, more than the pool can serve.
    let rows = calibration(&demand(500.0, 500.0), 32, 30.0);
    // Under overload some strategies collapse: the rows must span a real difference.
    let spread =
        rows.iter().map(|r| r.2).fold(0.0, f64::max) - rows.iter().map(|r| r.2).fold(1.0, f64::min);
    assert!(spread > 0.2, "{rows:?}");
    assert_calibrated(&rows, 0.15);
}

/// Nitsum's goodput and the best of its baselines (fixed-TP ablation, static FCFS, Split).
fn against_baselines(d: &[TierDemand], devices: u32) -> (crate::sim::SimResult, f64) {
    let requests = trace(d, 60.0, 3);
    let run = |p: Policy| simulate(&sim_config(p, devices, requests.clone())).unwrap();
    let nitsum = run(Policy::Adaptive);
    let mut best: f64 = run(Policy::Fixed(Strategy::Split)).goodput_rps;
    for tp in [1, 2, 4, 8] {
        best = best
            .max(run(Policy::Fixed(Strategy::FixedTp { tp })).goodput_rps)
            .max(run(Policy::Fixed(Strategy::StaticTp { tp })).goodput_rps);
    }
    (nitsum, best)
}

#[test]
fn the_choice_is_never_below_the_best_static_layout_on_a_stationary_workload() {
    let margin = LookaheadConfig::default().shadow_margin;
    for (d, label) in [
        (demand(15.0, 15.0), "below saturation"),
        (demand(120.0, 120.0), "overload"),
    ] {
        let (nitsum, best) = against_baselines(&d, 8);
        assert!(
            nitsum.goodput_rps >= 0.97 * best,
            "{label}: nitsum {:.1} vs best baseline {best:.1} req/s",
            nitsum.goodput_rps
        );
        // Every switch went to a strategy whose shadow met more than the one it left.
        for w in nitsum.choices.windows(2) {
            let (before, after) = (&w[0].1, &w[1].1);
            if after.chosen == before.chosen {
                continue;
            }
            let att = |name: String| {
                after
                    .candidates
                    .iter()
                    .find(|c| c.strategy == name)
                    .map(|c| c.attainment)
                    .unwrap()
            };
            let (to, from) = (att(after.chosen.name()), att(before.chosen.name()));
            assert!(to > from * (1.0 + margin), "{label}: {}", after.reason);
        }
    }
}

#[test]
fn a_switch_needs_a_significant_lead() {
    let requests = trace(&demand(5.0, 5.0), 5.0, 1);
    let cfg = LookaheadConfig::default();
    let mut bank = run_bank(&requests, &demand(5.0, 5.0), 8, &cfg, 3.0);
    let (cur, rival) = (0, 1);
    let k = bank.strategies.len();
    let set = |bank: &mut ShadowBank, met_cur: f64, lead: f64, against: f64| {
        bank.met = vec![met_cur; k];
        bank.met[rival] = met_cur + lead - against;
        bank.beats = vec![vec![0.0; k]; k];
        bank.beats_sq = vec![vec![0.0; k]; k];
        bank.beats[rival][cur] = lead;
        bank.beats[cur][rival] = against;
        bank.beats_sq[rival][cur] = lead;
        bank.beats_sq[cur][rival] = against;
    };
    // 3 requests more out of 100: within noise (sd of the sign test = sqrt(3)).
    set(&mut bank, 100.0, 3.0, 0.0);
    assert_eq!(bank.leader(cur, 2.0, 0.02), None);
    // 12 more, none fewer: significant, and 12% more than the strategy in force.
    set(&mut bank, 100.0, 12.0, 0.0);
    assert_eq!(bank.leader(cur, 2.0, 0.02), Some(rival));
    // 40 won, 28 lost: the lead of 12 is under 2 sd (sqrt(68) = 8.2 → 16.5).
    set(&mut bank, 100.0, 40.0, 28.0);
    assert_eq!(bank.leader(cur, 2.0, 0.02), None);
    // Significant but below the margin: 12 more out of 1000.
    set(&mut bank, 1000.0, 12.0, 0.0);
    assert_eq!(bank.leader(cur, 2.0, 0.02), None);
}

#[test]
fn shadows_forget_what_they_resolved() {
    let d = demand(20.0, 20.0);
    let requests = trace(&d, 120.0, 5);
    let bank = run_bank(&requests, &d, 8, &LookaheadConfig::default(), 120.0);
    // 40 req/s: a run holds the requests of the last few seconds, not the 4800 fed.
    assert!(bank.held() < 400, "{}", bank.held());
    assert!(bank.scored > 4000, "{}", bank.scored);
}

#[test]
fn the_forecast_choice_is_still_there() {
    let mut cfg = sim_config(Policy::Adaptive, 8, trace(&demand(10.0, 10.0), 10.0, 2));
    cfg.lookahead.choice = ChoiceKind::Forecast;
    let r = simulate(&cfg).unwrap();
    // The forecast choice predicts every candidate on a surge too; shadows have no surge.
    assert!(r.choices[0]
        .1
        .candidates
        .iter()
        .any(|c| c.surge_goodput_rps > 0.0));
    cfg.lookahead.choice = ChoiceKind::Shadow;
    let r = simulate(&cfg).unwrap();
    assert!(r.choices[0]
        .1
        .candidates
        .iter()
        .all(|c| c.surge_goodput_rps == 0.0));
}

#[test]
fn the_shadow_knobs_take_effect() {
    let d = demand(20.0, 20.0);
    let requests = trace(&d, 30.0, 9);
    let run = |cfg: LookaheadConfig| run_bank(&requests, &d, 8, &cfg, 30.0);
    let base = LookaheadConfig::default();
    // `memory_s`: a short memory weighs old requests less (same requests scored).
    let (long, short) = (
        run(LookaheadConfig {
            memory_s: 1e9,
            ..base.clone()
        }),
        run(LookaheadConfig {
            memory_s: 2.0,
            ..base.clone()
        }),
    );
    assert_eq!(long.scored, short.scored);
    assert!(
        short.total < 0.2 * long.total,
        "{} vs {}",
        short.total,
        long.total
    );
    // `settle_s`: requests are judged later, so fewer are scored by the same time.
    let late = run(LookaheadConfig {
        settle_s: 10.0,
        ..base.clone()
    });
    assert!(
        late.scored + 300 < long.scored,
        "{} vs {}",
        late.scored,
        long.scored
    );
    // `confidence` and `shadow_margin` reach the switch: an unreachable bar keeps the greedy.
    let mut cfg = sim_config(Policy::Adaptive, 8, trace(&demand(120.0, 120.0), 20.0, 3));
    let r = simulate(&cfg).unwrap();
    assert!(r.choices.iter().any(|c| c.1.chosen != Strategy::Greedy));
    cfg.lookahead.confidence = 1e9;
    let r = simulate(&cfg).unwrap();
    assert!(r.choices.iter().all(|c| c.1.chosen == Strategy::Greedy));
    cfg.lookahead.confidence = base.confidence;
    cfg.lookahead.shadow_margin = 1e9;
    let r = simulate(&cfg).unwrap();
    assert!(r.choices.iter().all(|c| c.1.chosen == Strategy::Greedy));
}
