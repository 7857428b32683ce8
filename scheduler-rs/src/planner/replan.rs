//! One window's plan ([`plan`]): the previous plan while it still serves the demand, else a
//! fresh one, unless under load the fresh one would serve too little more to be worth moving.

use crate::plan::Plan;
use crate::profile::Profile;
use crate::stats::TierDemand;
use crate::tiers::Tier;

use super::config::PlannerConfig;
use super::fresh::plan_fresh;
use super::keep;
use super::planned::Planned;
use super::score::{candidate_shapes, demand_by_tier, planned_rate};

/// Plan `devices` devices for `tiers` under `demand` (matched by tier name; tiers without an
/// entry have no demand). `previous` is kept outright while it still serves the demand
/// (`keep_utilization`), and otherwise lets placement keep existing groups.
pub fn plan(
    profile: &Profile,
    tiers: &[Tier],
    demand: &[TierDemand],
    devices: u32,
    previous: Option<&Plan>,
    cfg: &PlannerConfig,
) -> Planned {
    let levels = candidate_shapes(profile, cfg, devices);
    let by_tier = demand_by_tier(tiers, demand);
    let kept = previous
        .filter(|_| cfg.keep_utilization > 0.0)
        .and_then(|prev| keep::reevaluate(profile, tiers, &by_tier, devices, prev, cfg, &levels));
    if let Some(k) = kept
        .as_ref()
        .filter(|k| k.serves(tiers, &by_tier, cfg.keep_utilization))
    {
        return k.planned.clone();
    }
    let fresh = plan_fresh(profile, tiers, &by_tier, devices, previous, cfg, &levels);
    match kept {
        // NOTE: a re-plan moves devices and KV and stalls their requests; under overload the
        // window-to-window noise in rates and lengths would otherwise swing the layout every
        // window without serving more.
        Some(k)
            if served(
                tiers,
                &by_tier,
                &keep::capacity(tiers, &fresh.plan.groups),
                cfg,
            ) <= served(tiers, &by_tier, &k.capacity, cfg) * (1.0 + cfg.switch_gain) =>
        {
            k.planned
        }
        _ => fresh,
    }
}

/// Weighted planned demand (as the greedy sizes it) that per-tier `capacity` serves.
fn served(
    tiers: &[Tier],
    demand: &[Option<&TierDemand>],
    capacity: &[f64],
    cfg: &PlannerConfig,
) -> f64 {
    tiers
        .iter()
        .zip(demand)
        .zip(capacity)
        .map(|((t, &d), &cap)| {
            let rate = planned_rate(t, d, cfg);
            t.weight.max(0.0) * rate.min(cap)
        })
        .sum()
}
