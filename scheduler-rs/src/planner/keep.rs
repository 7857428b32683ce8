//! Hysteresis: keep the previous plan while it still serves every tier's current demand.
//!
//! Window-to-window noise in arrival counts and lengths would otherwise re-shape groups every
//! window, and each reshape costs a TP switch, KV migration and lost iterations. The previous
//! plan is re-evaluated under the *current* demand (fresh estimates per group); if every tier's
//! rate fits within `keep_utilization` of its capacity, the groups stay as they are (only
//! `max_rps`, `max_inflight` and batch caps are refreshed) and nothing moves.

use std::collections::HashMap;

use crate::plan::{Plan, Role};
use crate::profile::Profile;
use crate::stats::TierDemand;
use crate::tiers::Tier;

use super::efficiency;
use super::{shape, Planned, PlannerConfig};

/// The previous plan with refreshed capacities, or `None` when it must be re-planned.
pub fn reuse(
    profile: &Profile,
    tiers: &[Tier],
    demand: &HashMap<&str, &TierDemand>,
    devices: u32,
    prev: &Plan,
    cfg: &PlannerConfig,
    levels: &[u32],
) -> Option<Planned> {
    let index: HashMap<&str, usize> = tiers
        .iter()
        .enumerate()
        .map(|(i, t)| (t.name.as_str(), i))
        .collect();
    // (mixed, prefill, decode) SLO throughput per tier.
    let mut cap = vec![(0.0, 0.0, 0.0); tiers.len()];
    let mut used = vec![false; devices as usize];
    // (max_rps, max_inflight) refreshed per group; cloned into a plan only on success.
    let mut fresh = Vec::with_capacity(prev.groups.len());
    let mut batch_caps = Vec::with_capacity(prev.groups.len());
    let mut memo: HashMap<(usize, u32, Role), Option<efficiency::GroupEstimate>> = HashMap::new();
    for g in &prev.groups {
        let ok = g.tp as usize == g.members.len()
            && levels.contains(&g.tp)
            && g.leader() % g.tp == 0
            && g.leader() + g.tp <= devices
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
        let [name] = g.tiers.as_slice() else {
            return None;
        };
        let i = *index.get(name.as_str())?;
        let d = demand.get(name.as_str())?;
        if tiers[i].background {
            return None;
        }
        // NOTE: groups share few distinct (tier, TP, role) shapes; estimating each once keeps
        // a failed reuse cheap at 1024 devices.
        let est = *memo.entry((i, g.tp, g.role)).or_insert_with(|| {
            let s = shape(&tiers[i], d, cfg);
            match g.role {
                Role::Mixed => efficiency::mixed(profile, g.tp, &s, cfg.chunk_tokens),
                Role::Prefill => {
                    efficiency::prefill(profile, g.tp, &s, cfg.prefill_slack, cfg.max_prefill_batch)
                }
                Role::Decode => efficiency::decode(profile, g.tp, &s),
            }
        });
        let est = est?;
        match g.role {
            Role::Mixed => cap[i].0 += est.rps,
            Role::Prefill => cap[i].1 += est.rps,
            Role::Decode => cap[i].2 += est.rps,
        }
        fresh.push((est.rps, est.rps * est.residence_s));
        batch_caps.push(est.batch_cap);
    }
    for (i, t) in tiers.iter().enumerate() {
        let rate = demand.get(t.name.as_str()).map_or(0.0, |d| d.rate_rps);
        let (m, p, d) = cap[i];
        if !t.background && rate > 0.0 && rate > (m + p.min(d)) * cfg.keep_utilization {
            return None;
        }
    }
    let mut groups = prev.groups.clone();
    for (g, (rps, inflight)) in groups.iter_mut().zip(fresh) {
        g.max_rps = rps;
        g.max_inflight = inflight;
    }
    Some(Planned {
        plan: Plan {
            epoch: prev.epoch + 1,
            groups,
        },
        batch_caps,
    })
}
