//! Hysteresis: keep the previous plan while it still serves every tier's current demand, or
//! while a new plan would not serve clearly more of it (`switch_gain`).
//!
//! Window-to-window noise in arrival counts and lengths would otherwise re-shape groups every
//! window, and each reshape costs a TP switch, KV migration and lost iterations. The previous
//! plan is re-evaluated under the *current* demand (fresh estimates per group); if every tier's
//! rate fits within `keep_utilization` of its capacity, the groups stay as they are (only
//! `max_rps`, `max_inflight` and batch caps are refreshed) and nothing moves.

use std::collections::HashMap;

use crate::plan::{Plan, Role};
use crate::profile::{Profile, Shape};
use crate::stats::TierDemand;
use crate::tiers::Tier;

use super::config::PlannerConfig;
use super::efficiency;
use super::planned::Planned;
use super::score::shape;

/// The previous plan re-estimated under the current demand.
pub struct Reevaluated {
    /// The previous groups with refreshed `max_rps`, `max_inflight` and batch caps.
    pub planned: Planned,
    /// Per tier (planner order): SLO throughput under it, mixed + min(prefill, decode).
    pub capacity: Vec<f64>,
}

impl Reevaluated {
    /// Whether every tier's rate is within `keep_utilization` of its capacity.
    pub fn serves(&self, tiers: &[Tier], demand: &[Option<&TierDemand>], keep: f64) -> bool {
        tiers
            .iter()
            .zip(demand)
            .zip(&self.capacity)
            .all(|((t, d), &cap)| {
                let rate = d.map_or(0.0, |d| d.rate_rps);
                t.background || rate <= 0.0 || rate <= cap * keep
            })
    }
}

/// Per tier (in `tiers` order): the SLO throughput `groups` plan for it.
pub fn capacity(tiers: &[Tier], groups: &[crate::plan::GroupPlan]) -> Vec<f64> {
    let mut cap = vec![(0.0, 0.0, 0.0); tiers.len()];
    for g in groups {
        let Some(i) = g.tiers.first().map(|t| t.index()) else {
            continue;
        };
        match g.role {
            Role::Mixed => cap[i].0 += g.max_rps,
            Role::Prefill => cap[i].1 += g.max_rps,
            Role::Decode => cap[i].2 += g.max_rps,
        }
    }
    cap.into_iter()
        .map(|(m, p, d)| m + f64::min(p, d))
        .collect()
}

/// The previous plan with refreshed capacities, or `None` when it no longer fits the pool, its
/// levels or its tiers (or a group of it can no longer meet its tier's SLOs at all).
pub fn reevaluate(
    profile: &Profile,
    tiers: &[Tier],
    demand: &[Option<&TierDemand>],
    devices: u32,
    prev: &Plan,
    cfg: &PlannerConfig,
    levels: &[Shape],
) -> Option<Reevaluated> {
    let mut used = vec![false; devices as usize];
    // (max_rps, max_inflight) refreshed per group; cloned into a plan only on success.
    let mut fresh = Vec::with_capacity(prev.groups.len());
    let mut batch_caps = Vec::with_capacity(prev.groups.len());
    let mut memo: HashMap<(usize, Shape, Role), Option<efficiency::GroupEstimate>> = HashMap::new();
    for g in &prev.groups {
        let ok = g.devices() as usize == g.members.len()
            && levels.contains(&g.shape())
            && g.leader() % g.devices() == 0
            && g.leader() + g.devices() <= devices
            && g.members.iter().zip(g.leader()..).all(|(&m, k)| m == k)
            && g.members
                .iter()
                .all(|&m| !std::mem::replace(&mut used[m as usize], true));
        if !ok {
            return None;
        }
        if g.tiers.is_empty() {
            fresh.push((g.max_rps, g.max_inflight));
            batch_caps.push(0.0);
            continue;
        }
        let [id] = g.tiers.as_slice() else {
            return None;
        };
        let i = id.index();
        let d = demand[i]?;
        if tiers[i].background {
            return None;
        }
        // NOTE: groups share few distinct (tier, TP, role) shapes; estimating each once keeps
        // a failed reuse cheap at 1024 devices.
        let est = *memo.entry((i, g.shape(), g.role)).or_insert_with(|| {
            let s = shape(&tiers[i], d, cfg);
            let (role, g) = (g.role, g.shape());
            match role {
                Role::Mixed => efficiency::mixed(profile, g, &s, cfg.chunk_tokens),
                Role::Prefill => {
                    efficiency::prefill(profile, g, &s, cfg.prefill_slack, cfg.max_prefill_batch)
                }
                Role::Decode => efficiency::decode(profile, g, &s),
            }
        });
        let est = est?;
        fresh.push((est.rps, est.rps * est.residence_s));
        batch_caps.push(est.batch_cap);
    }
    let mut groups = prev.groups.clone();
    for (g, (rps, inflight)) in groups.iter_mut().zip(fresh) {
        g.max_rps = rps;
        g.max_inflight = inflight;
    }
    let capacity = capacity(tiers, &groups);
    Some(Reevaluated {
        planned: Planned {
            plan: Plan {
                epoch: prev.epoch + 1,
                groups,
            },
            batch_caps,
        },
        capacity,
    })
}
