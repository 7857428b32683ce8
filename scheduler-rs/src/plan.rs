//! The plan: which device groups exist, at which TP level, in which role, for which tiers.
//! Shared vocabulary of the planner (which makes plans), the dispatcher (which routes by
//! them), the control loop (which applies them) and the simulator.
//!
//! NOTE: inside the router a plan names its tiers by [`TierId`] ([`GroupPlan`], [`Plan`]);
//! names appear only at the serde boundary (worker `reconfigure`, `/admin/plan`, plan JSON,
//! config files), where [`Plan::named`] and [`NamedPlan::resolve`] convert against the tier
//! list the ids index.

use anyhow::{anyhow, Result};
use serde::{Deserialize, Serialize};

use crate::ids::TierId;
use crate::profile::Shape;
use crate::tiers::Tier;

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

/// One TP group of devices, its tiers as `T`: [`TierId`]s inside the router, names
/// ([`NamedGroupPlan`]) on the wire.
///
/// NOTE: only the named form is (de)serializable (the serde bounds ask `T: AsRef<str>`, which
/// `TierId` is not), so a plan cannot reach JSON or msgpack with bare tier indices.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(bound(
    serialize = "T: Serialize + AsRef<str>",
    deserialize = "T: Deserialize<'de> + AsRef<str>"
))]
pub struct GroupPlan<T = TierId> {
    /// Device (worker) ids, contiguous and aligned to `tp` (`members[0] % tp == 0`).
    pub members: Vec<u32>,
    /// Tensor-parallel degree (of each stage, in a pipeline); `members.len() == tp * pp`.
    pub tp: u32,
    /// Pipeline stages of `tp` devices, members stage-major (1: a TP group).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub pp: u32,
    pub role: Role,
    /// Tiers this group is planned for. Empty: best-effort only.
    pub tiers: Vec<T>,
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

/// A [`GroupPlan`] as serialized: tiers by name.
pub type NamedGroupPlan = GroupPlan<String>;

impl<T> GroupPlan<T> {
    /// The same group planned for `tiers` (the same tiers in another form).
    fn with_tiers<U>(self, tiers: Vec<U>) -> GroupPlan<U> {
        GroupPlan {
            tiers,
            members: self.members,
            tp: self.tp,
            pp: self.pp,
            role: self.role,
            accepts_background: self.accepts_background,
            max_rps: self.max_rps,
            max_inflight: self.max_inflight,
        }
    }

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
}

impl GroupPlan {
    /// The serde form: tier ids replaced by their names in `tiers` (the list they index).
    pub fn named(&self, tiers: &[Tier]) -> NamedGroupPlan {
        let names = self
            .tiers
            .iter()
            .map(|id| tiers[id.index()].name.clone())
            .collect();
        self.clone().with_tiers(names)
    }

    /// Short form for logs: role initial, TP, `@` leader, `:` tiers (`-`: best-effort only),
    /// e.g. `P1@0:strict`, `D2@2:strict`, `M1@1:-`.
    pub fn summary(&self, tiers: &[Tier]) -> String {
        let role = match self.role {
            Role::Prefill => 'P',
            Role::Decode => 'D',
            Role::Mixed => 'M',
        };
        let tiers = if self.tiers.is_empty() {
            "-".to_string()
        } else {
            let names: Vec<&str> = self
                .tiers
                .iter()
                .map(|id| tiers[id.index()].name.as_str())
                .collect();
            names.join("+")
        };
        format!("{role}{}@{}:{tiers}", self.shape().key(), self.leader())
    }
}

impl NamedGroupPlan {
    /// The router form: tier names resolved to their positions in `tiers`. Errs on a name
    /// the list lacks (no request of that tier can come, so the plan is wrong).
    pub fn resolve(self, tiers: &[Tier]) -> Result<GroupPlan> {
        let ids = self
            .tiers
            .iter()
            .map(|name| {
                let i = tiers.iter().position(|t| t.name == *name);
                i.map(TierId).ok_or_else(|| {
                    anyhow!("plan group {:?} uses unknown tier {name:?}", self.members)
                })
            })
            .collect::<Result<_>>()?;
        Ok(self.with_tiers(ids))
    }
}

/// A whole-pool plan for one control epoch, its tiers as `T` (see [`GroupPlan`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(bound(
    serialize = "T: Serialize + AsRef<str>",
    deserialize = "T: Deserialize<'de> + AsRef<str>"
))]
pub struct Plan<T = TierId> {
    /// Monotonic plan number; workers ack `reconfigure` with it.
    pub epoch: u64,
    pub groups: Vec<GroupPlan<T>>,
}

/// A [`Plan`] as serialized: tiers by name.
pub type NamedPlan = Plan<String>;

impl<T> Default for Plan<T> {
    fn default() -> Self {
        Plan {
            epoch: 0,
            groups: Vec::new(),
        }
    }
}

impl Plan {
    /// The serde form: tier ids replaced by their names in `tiers` (the list they index).
    pub fn named(&self, tiers: &[Tier]) -> NamedPlan {
        Plan {
            epoch: self.epoch,
            groups: self.groups.iter().map(|g| g.named(tiers)).collect(),
        }
    }
}

impl Plan {
    /// The plan as one of `routers` routers dispatches by it: each group's SLO bandwidth
    /// (`max_rps`, `max_inflight`) split evenly between them (architecture §4 "Several
    /// routers"); 0 (unbounded) stays unbounded.
    pub fn shared_by(&self, routers: u32) -> Plan {
        let n = f64::from(routers.max(1));
        let mut plan = self.clone();
        for g in &mut plan.groups {
            g.max_rps /= n;
            g.max_inflight /= n;
        }
        plan
    }
}

impl NamedPlan {
    /// The router form: every group's tier names resolved against `tiers`.
    pub fn resolve(self, tiers: &[Tier]) -> Result<Plan> {
        Ok(Plan {
            epoch: self.epoch,
            groups: self
                .groups
                .into_iter()
                .map(|g| g.resolve(tiers))
                .collect::<Result<_>>()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiers(names: &[&str]) -> Vec<Tier> {
        names.iter().map(|n| Tier::with_name(n)).collect()
    }

    const PLAN_JSON: &str = r#"{"epoch":4,"groups":[{"members":[0,1],"tp":2,"role":"prefill","tiers":["gold","silver"],"accepts_background":false,"max_rps":2.5,"max_inflight":3.0},{"members":[2],"tp":1,"role":"mixed","tiers":[],"accepts_background":true,"max_rps":0.0,"max_inflight":0.0}]}"#;

    #[test]
    fn names_resolve_to_positions_and_name_back_byte_identically() {
        // The list order decides the ids: "gold" is 1 here, "silver" 0.
        let list = tiers(&["silver", "gold"]);
        let named: NamedPlan = serde_json::from_str(PLAN_JSON).unwrap();
        let plan = named.resolve(&list).unwrap();
        assert_eq!(plan.groups[0].tiers, [TierId(1), TierId(0)]);
        assert!(plan.groups[1].tiers.is_empty());
        assert_eq!((plan.epoch, plan.groups[0].max_rps), (4, 2.5));
        assert_eq!(
            serde_json::to_string(&plan.named(&list)).unwrap(),
            PLAN_JSON
        );
    }

    #[test]
    fn an_unknown_tier_name_is_refused() {
        let named: NamedPlan = serde_json::from_str(PLAN_JSON).unwrap();
        let err = named.resolve(&tiers(&["gold"])).unwrap_err();
        assert!(err.to_string().contains("\"silver\""), "{err}");
    }

    #[test]
    fn routers_share_a_groups_slo_bandwidth_and_unbounded_stays_unbounded() {
        let named: NamedPlan = serde_json::from_str(PLAN_JSON).unwrap();
        let plan = named.resolve(&tiers(&["silver", "gold"])).unwrap();
        let half = plan.shared_by(2);
        assert_eq!(
            (half.groups[0].max_rps, half.groups[0].max_inflight),
            (1.25, 1.5)
        );
        assert_eq!(
            (half.groups[1].max_rps, half.groups[1].max_inflight),
            (0.0, 0.0)
        );
        assert_eq!(plan.shared_by(1), plan);
        assert_eq!(plan.shared_by(0), plan);
    }

    #[test]
    fn summary_names_the_tiers() {
        let list = tiers(&["silver", "gold"]);
        let named: NamedPlan = serde_json::from_str(PLAN_JSON).unwrap();
        let plan = named.resolve(&list).unwrap();
        let layout: Vec<String> = plan.groups.iter().map(|g| g.summary(&list)).collect();
        assert_eq!(layout, ["P2@0:gold+silver", "M1@2:-"]);
    }
}
