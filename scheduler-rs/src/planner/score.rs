//! What the planner's steps share: the candidate group shapes, a tier's planning shape and
//! the rate it is sized for.
//!
//! NOTE: here rather than in `planner/mod.rs`, so the planner's steps (`fresh.rs`,
//! `keep.rs`, `strategy.rs`, `replan.rs`) never import the module that declares them.

use crate::profile::{Profile, Shape};
use crate::stats::{LengthStats, TierDemand};
use crate::tiers::Tier;

use super::config::PlannerConfig;
use super::efficiency::TierShape;

/// Candidate TP levels: profiled ∩ allowed, ≤ `devices`, reduced to a divisibility chain
/// (each kept level divides the next) so aligned placement can never fragment.
pub fn candidate_levels(profile: &Profile, cfg: &PlannerConfig, devices: u32) -> Vec<u32> {
    let mut out: Vec<u32> = Vec::new();
    for t in profile.tp_levels() {
        let allowed = cfg.tp_levels.as_ref().is_none_or(|l| l.contains(&t));
        if allowed && t <= devices && out.last().is_none_or(|&prev| t % prev == 0) {
            out.push(t);
        }
    }
    out
}

/// Candidate group shapes of the adaptive planner: the TP chain of `candidate_levels`, plus
/// the profile's pipelines whose device count is one of its levels (so sizes stay a
/// divisibility chain), unless `cfg.tp_levels` restricts the plan to TP levels.
pub fn candidate_shapes(profile: &Profile, cfg: &PlannerConfig, devices: u32) -> Vec<Shape> {
    let levels = candidate_levels(profile, cfg, devices);
    let mut out: Vec<Shape> = levels.iter().map(|&t| Shape::from(t)).collect();
    if cfg.tp_levels.is_none() {
        out.extend(
            profile
                .shapes()
                .into_iter()
                .filter(|s| s.pp > 1 && levels.contains(&s.devices())),
        );
    }
    out.sort_by_key(|s| (s.devices(), s.pp));
    out
}

/// A tier's planning shape under `cfg` (SLOs scaled by `slo_margin`). Lengths not observed
/// yet take `cfg.prior_lengths`.
/// NOTE: output lengths come from completions, so a tier's first window has arrivals but no
/// outputs: planning that as 1-token outputs makes decode look free and sizes every group for
/// prefill alone (the simulator's Azure conv runs collapsed into TP-1 groups that way).
pub fn shape(tier: &Tier, d: &TierDemand, cfg: &PlannerConfig) -> TierShape {
    let unknown = |l: &LengthStats| l.count == 0 && l.mean <= 0.0;
    let mut d = d.clone();
    if unknown(&d.prompt) {
        d.prompt = LengthStats::constant(cfg.prior_lengths.0);
    }
    if unknown(&d.output) {
        d.output = LengthStats::constant(cfg.prior_lengths.1);
    }
    let mut s = TierShape::new(tier, &d);
    s.ttft_ms *= cfg.slo_margin;
    s.tpot_ms *= cfg.slo_margin;
    s
}

/// `demand` by tier: entry `i` is the demand of `tiers[i]` (the last entry naming it, as a
/// map by name would keep), `None` for a tier without one.
///
/// NOTE: demand names its tiers (it crosses plan JSON and `/admin/plan` by name); the planner
/// resolves the names here, once per planning call, and then looks demand up by position.
pub fn demand_by_tier<'a>(tiers: &[Tier], demand: &'a [TierDemand]) -> Vec<Option<&'a TierDemand>> {
    let mut out = vec![None; tiers.len()];
    for d in demand {
        if let Some(i) = tiers.iter().position(|t| t.name == d.tier) {
            out[i] = Some(d);
        }
    }
    out
}

/// The demand the planner sizes a tier for: its arrival rate / `target_utilization` (0 for a
/// background tier or one without demand).
pub fn planned_rate(tier: &Tier, demand: Option<&TierDemand>, cfg: &PlannerConfig) -> f64 {
    match demand {
        Some(d) if !tier.background => {
            d.rate_rps.max(0.0) / cfg.target_utilization.clamp(0.05, 1.0)
        }
        _ => 0.0,
    }
}
