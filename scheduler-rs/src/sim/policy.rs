//! The simulated policies ([`Policy`]) and their flat JSON names; what each plans with is
//! `policy_plans.rs`: the live planner (Nitsum and its fixed-TP ablation) or a static plan
//! built once (static TP-k, per-tier split, a given plan).

use serde::{Deserialize, Serialize};

use crate::plan::NamedPlan;
use crate::planner::strategy::Strategy;

/// How the cluster is configured and requests are routed.
///
/// NOTE: on the wire (the simulator's JSON config) each policy keeps its flat name
/// (`{"kind": "nitsum"}`, `{"kind": "static_tp", "tp": 4}`, ...; see [`PolicyWire`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(from = "PolicyWire", into = "PolicyWire")]
pub enum Policy {
    /// Adaptive Nitsum: every selection round the lookahead (`lookahead.rs`) picks the
    /// layout strategy whose simulated goodput over the next seconds is highest; live
    /// strategies re-plan every control window.
    Adaptive,
    /// One layout strategy for the whole run, with no strategy choice: a live one re-plans
    /// every control window (`Greedy`: Nitsum before issue 10; `FixedTp`: the Nitsum §4.2.1
    /// ablation), a static one plans once (`StaticTp`: SLO-agnostic SGLang-like FCFS, no
    /// tiers; `Split`: the paper's per-tier split sized by the whole trace's shares, each
    /// tier on its best static level, rejecting what a partition's SLO bandwidth cannot take).
    Fixed(Strategy),
    /// A given plan for the whole trace (e.g. SGLang-PD-like static disaggregation, or any
    /// layout to test). `batch_caps` per group; missing or 0: the profile's max batch.
    ///
    /// NOTE: the plan is kept as the config states it (tiers by name): it is resolved
    /// against `SimConfig::tiers` when the simulation starts ([`static_plan`]), since serde
    /// reads the policy without the tier list.
    FixedPlan {
        plan: NamedPlan,
        batch_caps: Vec<f64>,
        /// Reject what the plan's SLO bandwidth cannot take (as Split does).
        reject_best_effort: bool,
    },
}

impl Policy {
    /// Short name for results: `nitsum`, `nitsum-greedy`, `nitsum-fixed-tp2`, `static-tp4`,
    /// `split`, `fixed-plan`.
    pub fn name(&self) -> String {
        match self {
            Policy::Adaptive => "nitsum".into(),
            Policy::Fixed(Strategy::Greedy) => "nitsum-greedy".into(),
            Policy::Fixed(Strategy::FixedTp { tp }) => format!("nitsum-fixed-tp{tp}"),
            Policy::Fixed(s) => s.name(),
            Policy::FixedPlan { .. } => "fixed-plan".into(),
        }
    }
}

/// [`Policy`] as the JSON config names it: one flat tag per policy.
#[derive(Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum PolicyWire {
    Nitsum,
    NitsumGreedy,
    NitsumFixedTp {
        tp: u32,
    },
    StaticTp {
        tp: u32,
    },
    Split,
    FixedPlan {
        plan: NamedPlan,
        #[serde(default)]
        batch_caps: Vec<f64>,
        #[serde(default)]
        reject_best_effort: bool,
    },
}

impl From<PolicyWire> for Policy {
    fn from(w: PolicyWire) -> Self {
        match w {
            PolicyWire::Nitsum => Policy::Adaptive,
            PolicyWire::NitsumGreedy => Policy::Fixed(Strategy::Greedy),
            PolicyWire::NitsumFixedTp { tp } => Policy::Fixed(Strategy::FixedTp { tp }),
            PolicyWire::StaticTp { tp } => Policy::Fixed(Strategy::StaticTp { tp }),
            PolicyWire::Split => Policy::Fixed(Strategy::Split),
            PolicyWire::FixedPlan {
                plan,
                batch_caps,
                reject_best_effort,
            } => Policy::FixedPlan {
                plan,
                batch_caps,
                reject_best_effort,
            },
        }
    }
}

impl From<Policy> for PolicyWire {
    fn from(p: Policy) -> Self {
        match p {
            Policy::Adaptive => PolicyWire::Nitsum,
            Policy::Fixed(Strategy::Greedy) => PolicyWire::NitsumGreedy,
            Policy::Fixed(Strategy::FixedTp { tp }) => PolicyWire::NitsumFixedTp { tp },
            Policy::Fixed(Strategy::StaticTp { tp }) => PolicyWire::StaticTp { tp },
            Policy::Fixed(Strategy::Split) => PolicyWire::Split,
            Policy::FixedPlan {
                plan,
                batch_caps,
                reject_best_effort,
            } => PolicyWire::FixedPlan {
                plan,
                batch_caps,
                reject_best_effort,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_keep_their_flat_json_names() {
        // The Python side (`nitsum simulate`, the sweep scripts) writes these exact forms.
        let cases = [
            (r#"{"kind":"nitsum"}"#, Policy::Adaptive),
            (
                r#"{"kind":"nitsum_greedy"}"#,
                Policy::Fixed(Strategy::Greedy),
            ),
            (
                r#"{"kind":"nitsum_fixed_tp","tp":2}"#,
                Policy::Fixed(Strategy::FixedTp { tp: 2 }),
            ),
            (
                r#"{"kind":"static_tp","tp":4}"#,
                Policy::Fixed(Strategy::StaticTp { tp: 4 }),
            ),
            (r#"{"kind":"split"}"#, Policy::Fixed(Strategy::Split)),
        ];
        for (json, policy) in cases {
            assert_eq!(serde_json::from_str::<Policy>(json).unwrap(), policy);
            assert_eq!(serde_json::to_string(&policy).unwrap(), json);
        }
        let fixed: Policy =
            serde_json::from_str(r#"{"kind":"fixed_plan","plan":{"epoch":3,"groups":[]}}"#)
                .unwrap();
        let Policy::FixedPlan {
            plan,
            batch_caps,
            reject_best_effort,
        } = &fixed
        else {
            panic!("{fixed:?}");
        };
        assert_eq!(
            (plan.epoch, batch_caps.len(), *reject_best_effort),
            (3, 0, false)
        );
        assert_eq!(fixed.name(), "fixed-plan");
        assert_eq!(
            Policy::Fixed(Strategy::FixedTp { tp: 2 }).name(),
            "nitsum-fixed-tp2"
        );
        assert_eq!(
            Policy::Fixed(Strategy::StaticTp { tp: 4 }).name(),
            "static-tp4"
        );
    }
}
