//! The plan: which device groups exist, at which TP level, in which role, for which tiers.
//! Shared vocabulary of the planner (which makes plans), the dispatcher (which routes by
//! them), the control loop (which applies them) and the simulator.

use serde::{Deserialize, Serialize};

use crate::profile::Shape;

/// What a group does with the requests routed to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Prefill only; the KV cache then moves to a decode group.
    Prefill,
    /// Decode only; receives KV from prefill groups.
    Decode,
    /// Prefill and decode on the same group (no disaggregation).
    Mixed,
}

/// One TP group of devices.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupPlan {
    /// Device (worker) ids, contiguous and aligned to `tp` (`members[0] % tp == 0`).
    pub members: Vec<u32>,
    /// Tensor-parallel degree (of each stage, in a pipeline); `members.len() == tp * pp`.
    pub tp: u32,
    /// Pipeline stages of `tp` devices, members stage-major (1: a TP group).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub pp: u32,
    pub role: Role,
    /// Tiers this group is planned for (names from the tier config). Empty: best-effort only.
    pub tiers: Vec<String>,
    /// Whether background requests may be placed here.
    pub accepts_background: bool,
    /// Planned SLO-compliant throughput of this group in requests/s (0 when unknown); the
    /// dispatcher's available bandwidth is this minus the group's assigned unfinished work.
    pub max_rps: f64,
    /// SLO-compliant number of unfinished requests the group can hold (Little's law on
    /// `max_rps` and the tier's expected residence time). `f64::INFINITY` or 0 = unbounded
    /// (a static plan without a profile): every request counts as feasible.
    #[serde(default)]
    pub max_inflight: f64,
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

impl GroupPlan {
    /// The group's parallel shape (its profile key).
    pub fn shape(&self) -> Shape {
        Shape {
            tp: self.tp,
            pp: self.pp,
        }
    }

    /// Devices the group takes: `tp · pp`.
    pub fn devices(&self) -> u32 {
        self.tp * self.pp
    }

    /// The group leader: the worker that receives `generate` for the group.
    pub fn leader(&self) -> u32 {
        self.members[0]
    }

    /// Short form for logs: role initial, TP, `@` leader, `:` tiers (`-`: best-effort only),
    /// e.g. `P1@0:strict`, `D2@2:strict`, `M1@1:-`.
    pub fn summary(&self) -> String {
        let role = match self.role {
            Role::Prefill => 'P',
            Role::Decode => 'D',
            Role::Mixed => 'M',
        };
        let tiers = if self.tiers.is_empty() {
            "-".to_string()
        } else {
            self.tiers.join("+")
        };
        format!("{role}{}@{}:{tiers}", self.shape().key(), self.leader())
    }
}

/// A whole-pool plan for one control epoch.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// Monotonic plan number; workers ack `reconfigure` with it.
    pub epoch: u64,
    pub groups: Vec<GroupPlan>,
}
