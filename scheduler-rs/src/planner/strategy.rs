//! Layout strategies: the families of plans the adaptive chooser picks between
//! (`sim::lookahead`), each also a baseline of its own.
//!
//! - [`Strategy::Greedy`]: the goodput planner over every allowed TP level ([`super::plan`]).
//! - [`Strategy::FixedTp`]: the same planner restricted to one level (the Nitsum §4.2.1
//!   "no dynamic TP" ablation).
//! - [`Strategy::StaticTp`]: SLO-agnostic uniform TP-`k` mixed groups serving every tier with
//!   no admission limit (SGLang-like FCFS).
//! - [`Strategy::Split`]: one partition per SLO tier sized by its share of the demand, each on
//!   the tier's best mixed level, admitting up to its SLO bandwidth (the paper's "Split").
//!
//! NOTE: including every static family as a candidate is what lets the chooser never fall
//! below a static layout: whatever a static layout would do next is one of the options.

use serde::{Deserialize, Serialize};

use crate::ids::TierId;
use crate::plan::{Plan, Role};
use crate::profile::{Profile, Shape};
use crate::stats::TierDemand;
use crate::tiers::Tier;

use super::config::PlannerConfig;
use super::efficiency;
use super::placement::{self, Wanted};
use super::planned::Planned;
use super::replan::plan;
use super::score::{candidate_levels, shape};

/// A family of layouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Strategy {
    Greedy,
    FixedTp { tp: u32 },
    StaticTp { tp: u32 },
    Split,
}

impl Strategy {
    /// Short name for logs and timelines: `greedy`, `fixed-tp2`, `static-tp4`, `split`.
    pub fn name(&self) -> String {
        match self {
            Strategy::Greedy => "greedy".into(),
            Strategy::FixedTp { tp } => format!("fixed-tp{tp}"),
            Strategy::StaticTp { tp } => format!("static-tp{tp}"),
            Strategy::Split => "split".into(),
        }
    }

    /// Whether the layout is re-planned every window from the demand (live) rather than
    /// built once when the strategy is chosen.
    pub fn is_live(&self) -> bool {
        matches!(self, Strategy::Greedy | Strategy::FixedTp { .. })
    }

    /// Every strategy over `levels`: the greedy, then per level fixed and static, then split.
    pub fn all(levels: &[u32]) -> Vec<Strategy> {
        let mut out = vec![Strategy::Greedy];
        out.extend(levels.iter().map(|&tp| Strategy::FixedTp { tp }));
        out.extend(levels.iter().map(|&tp| Strategy::StaticTp { tp }));
        out.push(Strategy::Split);
        out
    }
}

/// The plan `strategy` makes for `devices` under `demand` (`previous` lets live strategies
/// keep groups in place). Levels are those of [`candidate_levels`] under `cfg`.
pub fn plan_strategy(
    strategy: Strategy,
    profile: &Profile,
    tiers: &[Tier],
    demand: &[TierDemand],
    devices: u32,
    previous: Option<&Plan>,
    cfg: &PlannerConfig,
) -> Planned {
    match strategy {
        Strategy::Greedy => plan(profile, tiers, demand, devices, previous, cfg),
        Strategy::FixedTp { tp } => {
            let cfg = PlannerConfig {
                tp_levels: Some(vec![tp]),
                ..cfg.clone()
            };
            plan(profile, tiers, demand, devices, previous, &cfg)
        }
        Strategy::StaticTp { tp } => static_tp(tiers, devices, tp, previous),
        Strategy::Split => split(profile, tiers, demand, devices, previous, cfg),
    }
}

/// ⌊devices / tp⌋ mixed TP-`tp` groups serving every tier, unbounded capacity.
pub fn static_tp(tiers: &[Tier], devices: u32, tp: u32, previous: Option<&Plan>) -> Planned {
    let all: Vec<TierId> = (0..tiers.len()).map(TierId).collect();
    let wanted = (0..devices / tp.max(1))
        .map(|_| Wanted {
            shape: Shape::from(tp),
            role: Role::Mixed,
            tiers: all.clone(),
            accepts_background: true,
            max_rps: 0.0,
            max_inflight: 0.0,
            batch_cap: 0.0,
        })
        .collect();
    Planned::from_placed(placement::place(wanted, devices, previous), previous)
}

/// Split: one partition per SLO tier with demand, sized by its share of the requests, each on
/// its best mixed level (or `cfg.tp_levels`' only level) with the planner's SLO bandwidth.
pub fn split(
    profile: &Profile,
    tiers: &[Tier],
    demand: &[TierDemand],
    devices: u32,
    previous: Option<&Plan>,
    cfg: &PlannerConfig,
) -> Planned {
    let levels = candidate_levels(profile, cfg, devices);
    let Some(&smallest) = levels.first() else {
        return Planned::from_placed(Vec::new(), previous);
    };
    let rate = |t: &Tier| {
        demand
            .iter()
            .find(|d| d.tier == t.name)
            .filter(|_| !t.background)
            .map_or(0.0, |d| d.rate_rps.max(0.0))
    };
    let total: f64 = tiers.iter().map(rate).sum();
    // (tp, group template, share of requests) for SLO tiers with traffic.
    let mut parts: Vec<(u32, Wanted, f64)> = Vec::new();
    for (id, tier, d) in tiers.iter().enumerate().filter_map(|(i, t)| {
        let d = demand.iter().find(|d| d.tier == t.name)?;
        (rate(t) > 0.0).then_some((TierId(i), t, d))
    }) {
        let shape = shape(tier, d, cfg);
        let est = |t: u32| efficiency::mixed(profile, t, &shape, cfg.chunk_tokens);
        let best = levels
            .iter()
            .filter_map(|&t| est(t).map(|e| (t, e)))
            .max_by(|a, b| (a.1.rps / f64::from(a.0)).total_cmp(&(b.1.rps / f64::from(b.0))));
        let (tp, (max_rps, max_inflight, batch_cap)) = best
            .map_or((smallest, (0.0, 0.0, 0.0)), |(t, e)| {
                (t, (e.rps, e.rps * e.residence_s, e.batch_cap))
            });
        let w = Wanted {
            shape: Shape::from(tp),
            role: Role::Mixed,
            tiers: vec![id],
            accepts_background: true,
            max_rps,
            max_inflight,
            batch_cap,
        };
        parts.push((tp, w, rate(tier) / total));
    }
    if parts.is_empty() {
        // No SLO demand: the greedy's idle layout (best-effort groups), not an empty pool.
        return plan(profile, tiers, demand, devices, previous, cfg);
    }
    // One group per tier first, then each next group to the tier furthest below its share.
    let mut given = vec![0u32; parts.len()];
    let mut free = devices;
    for (k, p) in parts.iter().enumerate() {
        if p.0 <= free {
            given[k] += p.0;
            free -= p.0;
        }
    }
    let n = f64::from(devices);
    while let Some(k) = (0..parts.len())
        .filter(|&k| parts[k].0 <= free)
        .max_by(|&a, &b| {
            let gap = |k: usize| parts[k].2 * n - f64::from(given[k]);
            gap(a).total_cmp(&gap(b)).then(b.cmp(&a))
        })
    {
        given[k] += parts[k].0;
        free -= parts[k].0;
    }
    let wanted = parts
        .iter()
        .zip(&given)
        .flat_map(|(p, &dev)| (0..dev / p.0).map(move |_| p.1.clone()))
        .collect();
    Planned::from_placed(placement::place(wanted, devices, previous), previous)
}
