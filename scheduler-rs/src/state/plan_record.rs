//! The record of one control decision, as logged and shown in `/admin/plan`'s history.

use serde::Serialize;

use crate::ids::{TierId, WorkerId};
use crate::plan::GroupPlan;
use crate::stats::TierDemand;
use crate::tiers::Tier;

/// How a control round ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PlanResult {
    /// Every worker acknowledged: routing switched to the new epoch.
    Applied,
    /// A worker answered `ok: false`: the old plan stays.
    Refused,
    /// Not every worker answered in time: the old plan stays.
    Timeout,
}

impl PlanResult {
    pub fn as_str(self) -> &'static str {
        match self {
            PlanResult::Applied => "applied",
            PlanResult::Refused => "refused",
            PlanResult::Timeout => "timeout",
        }
    }
}

/// A worker's `ok: false` answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Refusal {
    /// The refusing worker.
    pub worker: WorkerId,
    pub error: Option<String>,
}

/// One control decision, as logged and shown in `/admin/plan` history; its groups' tiers as
/// `T` (ids in the router, names once [`PlanRecord::named`] for JSON; see [`GroupPlan`]).
#[derive(Debug, Clone, Serialize)]
#[serde(bound(serialize = "T: Serialize + AsRef<str>"))]
pub struct PlanRecord<T = TierId> {
    /// Epoch the plan was proposed under (the `reconfigure` epoch).
    pub epoch: u64,
    /// Epoch routing runs under after the round (the new plan's, or the old plan's
    /// re-broadcast).
    pub routing_epoch: u64,
    pub result: PlanResult,
    pub unix_ms: u64,
    /// The proposed groups and their planner batch caps (0 = none).
    pub groups: Vec<GroupPlan<T>>,
    pub batch_caps: Vec<f64>,
    /// The groups routing ran on before the round.
    pub previous: Vec<GroupPlan<T>>,
    /// The demand the planner saw.
    pub demand: Vec<TierDemand>,
    pub refused: Vec<Refusal>,
    /// Workers that had not answered when the round ended.
    pub missing: Vec<WorkerId>,
    /// Planner decision time and round time (send → last ack or timeout).
    pub plan_ms: f64,
    pub round_ms: f64,
}

impl PlanRecord {
    /// The serde form: the groups' tier ids named from `tiers` (the list they index).
    pub fn named(&self, tiers: &[Tier]) -> PlanRecord<String> {
        let named = |groups: &[GroupPlan]| groups.iter().map(|g| g.named(tiers)).collect();
        PlanRecord {
            epoch: self.epoch,
            routing_epoch: self.routing_epoch,
            result: self.result,
            unix_ms: self.unix_ms,
            groups: named(&self.groups),
            batch_caps: self.batch_caps.clone(),
            previous: named(&self.previous),
            demand: self.demand.clone(),
            refused: self.refused.clone(),
            missing: self.missing.clone(),
            plan_ms: self.plan_ms,
            round_ms: self.round_ms,
        }
    }
}
