//! Goodput planner (Nitsum §3.3.1, architecture §4 steps 1-4): from the profile, the tiers' SLOs
//! and their current demand, decide the TP level, role and tier of every device group.
//!
//! Pure and allocation-light; the control loop calls it every window and the simulator calls
//! the same function. See docs/planner.md for the definitions and the JSON shapes.

mod config;
pub mod efficiency;
mod fresh;
pub mod greedy;
mod keep;
pub mod placement;
mod planned;
mod replan;
mod score;
pub mod strategy;

use crate::plan::{NamedPlan, Plan};
use crate::profile::Profile;
use crate::stats::TierDemand;
use crate::tiers::Tier;

pub use config::PlannerConfig;
pub use planned::Planned;
pub use replan::plan;
pub use score::{candidate_levels, candidate_shapes};

/// JSON form of [`plan`] (docs/planner.md): profile file, tier list, demand list and an
/// optional previous plan in; `{"epoch", "groups", "batch_caps"}` out.
pub fn plan_json(
    profile_json: &str,
    tiers_json: &str,
    demand_json: &str,
    devices: u32,
    previous_json: Option<&str>,
    config_json: Option<&str>,
) -> anyhow::Result<String> {
    use anyhow::Context;
    let profile = Profile::from_json(profile_json)?;
    let tiers: Vec<Tier> = serde_json::from_str(tiers_json).context("plan: invalid tiers JSON")?;
    let demand: Vec<TierDemand> =
        serde_json::from_str(demand_json).context("plan: invalid demand JSON")?;
    let previous: Option<Plan> = previous_json
        .map(serde_json::from_str::<NamedPlan>)
        .transpose()
        .context("plan: invalid previous plan JSON")?
        .map(|p| p.resolve(&tiers))
        .transpose()
        .context("plan: previous plan")?;
    let cfg: PlannerConfig = config_json
        .map(serde_json::from_str)
        .transpose()
        .context("plan: invalid planner config JSON")?
        .unwrap_or_default();
    anyhow::ensure!(devices > 0, "plan: num_devices must be positive");
    let out = plan(&profile, &tiers, &demand, devices, previous.as_ref(), &cfg);
    Ok(serde_json::to_string(&serde_json::json!({
        "epoch": out.plan.epoch,
        "groups": out.plan.named(&tiers).groups,
        "batch_caps": out.batch_caps,
    }))?)
}

#[cfg(test)]
mod tests;
