//! The binding-off twins: where the premium tier's TTFT needs TP, the shadows judge binding
//! on (the cost model) better than off on the same arrivals; without a bound tier there are
//! no twins and no verdict.

use crate::planner::candidate_levels;
use crate::planner::strategy::Strategy;
use crate::profile::Profile;
use crate::sim::forecast::RecentArrival;
use crate::sim::lookahead::tests::{knobs, planner_cfg, profile_file};
use crate::sim::lookahead::{LookaheadConfig, Situation};
use crate::sim::shadow::ShadowBank;
use crate::stats::{LengthStats, TierDemand};
use crate::tiers::Tier;

fn tiers(bind_tp: Option<u32>) -> Vec<Tier> {
    let mut t: Vec<Tier> = serde_json::from_str(
        r#"[{"name": "premium", "ttft_ms": 100.0, "tpot_ms": 50.0},
            {"name": "relaxed", "ttft_ms": 2000.0, "tpot_ms": 100.0}]"#,
    )
    .unwrap();
    t[0].bind_tp = bind_tp;
    t
}

/// (arrival, tier, prompt): 4k-token premium prompts every 0.25 s (TP 1 cannot prefill
/// them within 100 ms, TP 4 can), 512-token relaxed ones every 50 ms.
fn arrivals(until: f64) -> Vec<(f64, usize, f64)> {
    let mut out = Vec::new();
    for i in 0..(until * 20.0) as u32 {
        out.push((0.05 * f64::from(i), 1, 512.0));
    }
    for i in 0..(until * 4.0) as u32 {
        out.push((0.013 + 0.25 * f64::from(i), 0, 4096.0));
    }
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out
}

fn stats(mean: f64) -> LengthStats {
    LengthStats {
        count: 1000,
        mean,
        p50: mean,
        p90: mean,
        p99: mean,
    }
}

/// A bank driven as the control loop does, a round a second for `until` s; the index of
/// the DP layout (fixed TP 1) among its strategies.
fn bank(bind_tp: Option<u32>, until: f64) -> (ShadowBank, usize) {
    let profile = Profile::from_file(profile_file()).unwrap();
    let (t, pc) = (tiers(bind_tp), planner_cfg());
    let levels = candidate_levels(&profile, &pc, 8);
    let demand: Vec<TierDemand> = [
        ("premium", 4.0, 4096.0, 64.0),
        ("relaxed", 20.0, 512.0, 128.0),
    ]
    .iter()
    .map(|&(tier, rate_rps, p, o)| TierDemand {
        tier: tier.into(),
        rate_rps,
        prompt: stats(p),
        output: stats(o),
    })
    .collect();
    let cfg = LookaheadConfig {
        eval_devices: 8,
        memory_s: 1e9,
        ..LookaheadConfig::default()
    };
    let all = arrivals(until);
    let mut bank: Option<ShadowBank> = None;
    let mut now = 1.0;
    while now <= until + 5.0 {
        let recent: Vec<RecentArrival> = all
            .iter()
            .filter(|a| a.0 <= now && a.0 > now - cfg.lookback_s())
            .map(|&(at, tier, prompt)| RecentArrival {
                tier,
                age_s: now - at,
                prompt,
            })
            .collect();
        let s = Situation {
            profile: &profile,
            tiers: &t,
            demand: &demand,
            inflight: &[],
            recent: &recent,
            history_s: now,
            devices: 8,
            levels: &levels,
            planner: &pc,
            knobs: knobs(),
        };
        let b = bank.get_or_insert_with(|| ShadowBank::new(&s, &cfg, now - 1.5).unwrap());
        b.advance(&s, &cfg, now);
        now += 1.0;
    }
    let bank = bank.unwrap();
    let dp = bank
        .strategies
        .iter()
        .position(|&s| s == Strategy::FixedTp { tp: 1 })
        .expect("a DP layout among the strategies");
    (bank, dp)
}

#[test]
fn the_twins_judge_binding_better_where_the_premium_ttft_needs_tp() {
    let (b, dp) = bank(Some(4), 20.0);
    let v = b.binding_verdict(dp, 2.0).expect("a bound tier has twins");
    assert_eq!(v.strategy, "fixed-tp1");
    assert!(v.decisions.bound() > 10, "{v:?}");
    assert!(v.on_attainment > v.off_attainment + 0.1, "{v:?}");
    assert_eq!(v.better, "on", "{v:?}");
    // It travels in the choice (and so in /admin/plan's `strategy`).
    let json = serde_json::to_value(&v).unwrap();
    assert_eq!(json["policy"], "cost");
    assert!(
        json["decisions"]["full"].as_u64().unwrap()
            + json["decisions"]["prefill"].as_u64().unwrap()
            > 10
    );
}

#[test]
fn without_a_bound_tier_there_is_no_twin() {
    let (b, dp) = bank(None, 5.0);
    assert!(b.binding_verdict(dp, 2.0).is_none());
}
