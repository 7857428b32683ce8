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

/// [`plan`] with tiers by name at both ends (`nitsum._core.plan`, docs/planner.md): the
/// previous plan as it was handed out, and the new one with its `batch_caps`. Errs on a
/// previous plan naming a tier the list lacks, and on no devices.
pub fn plan_named(
    profile: &Profile,
    tiers: &[Tier],
    demand: &[TierDemand],
    devices: u32,
    previous: Option<NamedPlan>,
    cfg: &PlannerConfig,
) -> anyhow::Result<(NamedPlan, Vec<f64>)> {
    use anyhow::Context;
    let previous: Option<Plan> = previous
        .map(|p| p.resolve(tiers))
        .transpose()
        .context("plan: previous plan")?;
    anyhow::ensure!(devices > 0, "plan: num_devices must be positive");
    let out = plan(profile, tiers, demand, devices, previous.as_ref(), cfg);
    Ok((out.plan.named(tiers), out.batch_caps))
}

#[cfg(test)]
mod tests;
