//! What each simulated policy plans with: the live planner's settings (Nitsum and its
//! fixed-TP ablation), or a static plan built once (static TP-k, per-tier split, a given
//! plan), and the trace-wide demand a static plan is built for.

use anyhow::{ensure, Context, Result};

use crate::planner::strategy::{self, Strategy};
use crate::planner::{self, Planned, PlannerConfig};
use crate::profile::Profile;
use crate::stats::{LengthStats, TierDemand};

use super::policy::Policy;
use super::SimConfig;

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
