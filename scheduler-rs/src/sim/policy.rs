//! The simulated policies ([`Policy`]) and their plans: the live planner (Nitsum and its
//! fixed-TP ablation) or a static plan built once (static TP-k, per-tier split, a given plan).

use anyhow::{ensure, Context, Result};
use serde::{Deserialize, Serialize};

use crate::plan::NamedPlan;
use crate::planner::strategy::{self, Strategy};
use crate::planner::{self, Planned, PlannerConfig};
use crate::profile::Profile;
use crate::stats::{LengthStats, TierDemand};

use super::SimConfig;

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

/// Planner settings of a live policy; `None` for static ones.
pub fn planner_config(cfg: &SimConfig, profile: &Profile) -> Result<Option<PlannerConfig>> {
    let base = PlannerConfig {
        chunk_tokens: f64::from(cfg.chunk_tokens),
        slo_margin: cfg.slo_margin,
        target_utilization: cfg.target_utilization,
        ..PlannerConfig::default()
    };
    Ok(match &cfg.policy {
        Policy::Adaptive | Policy::Fixed(Strategy::Greedy) => Some(base),
        Policy::Fixed(Strategy::FixedTp { tp }) => {
            check_tp(profile, *tp, cfg.devices)?;
            Some(base)
        }
        Policy::Fixed(Strategy::StaticTp { .. } | Strategy::Split) | Policy::FixedPlan { .. } => {
            None
        }
    })
}

/// The strategy a live policy starts with (and, but for `nitsum`, keeps).
pub fn initial_strategy(policy: &Policy) -> Option<Strategy> {
    match policy {
        Policy::Adaptive => Some(Strategy::Greedy),
        Policy::Fixed(s) if s.is_live() => Some(*s),
        _ => None,
    }
}

fn check_tp(profile: &Profile, tp: u32, devices: u32) -> Result<()> {
    ensure!(
        profile.has_tp(tp),
        "TP {tp} is not in the profile (levels {:?})",
        profile.tp_levels()
    );
    ensure!(tp <= devices, "TP {tp} needs more than {devices} devices");
    Ok(())
}

/// The plan a static policy runs with for the whole trace.
pub fn static_plan(cfg: &SimConfig, profile: &Profile) -> Result<Planned> {
    match &cfg.policy {
        Policy::Fixed(Strategy::StaticTp { tp }) => {
            check_tp(profile, *tp, cfg.devices)?;
            Ok(strategy::static_tp(&cfg.tiers, cfg.devices, *tp, None))
        }
        Policy::Fixed(Strategy::Split) => {
            let pc = PlannerConfig {
                chunk_tokens: f64::from(cfg.chunk_tokens),
                slo_margin: cfg.slo_margin,
                ..PlannerConfig::default()
            };
            let levels = planner::candidate_levels(profile, &pc, cfg.devices);
            ensure!(
                !levels.is_empty(),
                "no profiled TP level fits {} devices",
                cfg.devices
            );
            let demand = trace_demand(cfg);
            Ok(strategy::split(
                profile,
                &cfg.tiers,
                &demand,
                cfg.devices,
                None,
                &pc,
            ))
        }
        Policy::FixedPlan {
            plan, batch_caps, ..
        } => {
            let mut used = vec![false; cfg.devices as usize];
            for g in &plan.groups {
                check_tp(profile, g.tp, cfg.devices)?;
                ensure!(
                    g.pp == 1 || profile.shapes().contains(&g.shape()),
                    "fixed plan: the profile has no pipeline {}",
                    g.shape().key()
                );
                let ok = g.members.len() == g.devices() as usize
                    && g.members.iter().all(|&m| {
                        m < cfg.devices && !std::mem::replace(&mut used[m as usize], true)
                    });
                ensure!(
                    ok,
                    "fixed plan: group {:?} is malformed or overlaps",
                    g.members
                );
            }
            let mut caps = batch_caps.clone();
            caps.resize(plan.groups.len(), 0.0);
            Ok(Planned {
                plan: plan.clone().resolve(&cfg.tiers).context("fixed plan")?,
                batch_caps: caps,
            })
        }
        _ => unreachable!("live policies are planned every window"),
    }
}

/// Whole-trace demand of each tier (rate over the trace span, mean lengths).
pub fn trace_demand(cfg: &SimConfig) -> Vec<TierDemand> {
    let span = trace_span(cfg);
    cfg.tiers
        .iter()
        .map(|t| {
            let mine: Vec<_> = cfg.requests.iter().filter(|r| r.tier == t.name).collect();
            let mut ins: Vec<f64> = mine.iter().map(|r| f64::from(r.input_len)).collect();
            let mut outs: Vec<f64> = mine.iter().map(|r| f64::from(r.output_len)).collect();
            TierDemand {
                tier: t.name.clone(),
                rate_rps: mine.len() as f64 / span,
                prompt: LengthStats::of(&mut ins),
                output: LengthStats::of(&mut outs),
            }
        })
        .collect()
}

/// Seconds from the first to the last arrival (at least 1 s, so tiny traces stay finite).
pub fn trace_span(cfg: &SimConfig) -> f64 {
    let first = cfg
        .requests
        .iter()
        .map(|r| r.arrival_s)
        .fold(f64::INFINITY, f64::min);
    let last = cfg
        .requests
        .iter()
        .map(|r| r.arrival_s)
        .fold(f64::NEG_INFINITY, f64::max);
    (last - first).max(1.0)
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
