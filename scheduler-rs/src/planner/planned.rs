//! The planner's output ([`Planned`]): a plan and the batch caps the local schedulers need.

use crate::plan::{GroupPlan, Plan};

/// A plan plus what the local schedulers need from it.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    pub plan: Plan,
    /// Per group (same order as `plan.groups`): decode batch cap that keeps the group's tier
    /// within TPOT; 0 for prefill-only and best-effort groups (no SLO cap).
    pub batch_caps: Vec<f64>,
}

impl Planned {
    /// Placed groups as the plan after `previous` (epoch + 1, or 1 for a first plan).
    pub fn from_placed(placed: Vec<(GroupPlan, f64)>, previous: Option<&Plan>) -> Self {
        let (groups, batch_caps) = placed.into_iter().unzip();
        Planned {
            plan: Plan {
                epoch: previous.map_or(1, |p| p.epoch + 1),
                groups,
            },
            batch_caps,
        }
    }
}
