//! The simulated policies' plans: the live planner (Nitsum and its fixed-TP ablation) or a
//! static plan built once (static TP-k, per-tier split).

use anyhow::{ensure, Result};

use crate::plan::{Plan, Role};
use crate::planner::efficiency::{self, TierShape};
use crate::planner::placement::{self, Wanted};
use crate::planner::{self, Planned, PlannerConfig};
use crate::profile::Profile;
use crate::stats::{LengthStats, TierDemand};
use crate::tiers::Tier;

use super::{Policy, SimConfig};

/// Planner settings of a live policy; `None` for static ones.
pub fn planner_config(cfg: &SimConfig, profile: &Profile) -> Result<Option<PlannerConfig>> {
    let base = PlannerConfig {
        chunk_tokens: f64::from(cfg.chunk_tokens),
        slo_margin: cfg.slo_margin,
        target_utilization: cfg.target_utilization,
        ..PlannerConfig::default()
    };
    Ok(match &cfg.policy {
        Policy::Nitsum => Some(base),
        Policy::NitsumFixedTp { tp } => {
            check_tp(profile, *tp, cfg.devices)?;
            Some(PlannerConfig {
                tp_levels: Some(vec![*tp]),
                ..base
            })
        }
        Policy::StaticTp { .. } | Policy::Split { .. } | Policy::FixedPlan { .. } => None,
    })
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
        Policy::StaticTp { tp } => {
            check_tp(profile, *tp, cfg.devices)?;
            let names: Vec<String> = cfg.tiers.iter().map(|t| t.name.clone()).collect();
            let wanted = (0..cfg.devices / tp)
                .map(|_| Wanted {
                    tp: *tp,
                    role: Role::Mixed,
                    tiers: names.clone(),
                    accepts_background: true,
                    max_rps: 0.0,
                    max_inflight: 0.0,
                    batch_cap: 0.0,
                })
                .collect();
            Ok(finish(placement::place(wanted, cfg.devices, None)))
        }
        Policy::Split { tp } => split(cfg, profile, tp),
        Policy::FixedPlan { plan, batch_caps } => {
            let mut used = vec![false; cfg.devices as usize];
            for g in &plan.groups {
                check_tp(profile, g.tp, cfg.devices)?;
                let ok = g.members.len() == g.tp as usize
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
                plan: plan.clone(),
                batch_caps: caps,
            })
        }
        _ => unreachable!("live policies are planned every window"),
    }
}

fn finish(placed: Vec<(crate::plan::GroupPlan, f64)>) -> Planned {
    let (groups, batch_caps) = placed.into_iter().unzip();
    Planned {
        plan: Plan { epoch: 1, groups },
        batch_caps,
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

/// Split: one static partition per SLO tier, sized by its share of requests.
fn split(
    cfg: &SimConfig,
    profile: &Profile,
    fixed: &std::collections::BTreeMap<String, u32>,
) -> Result<Planned> {
    let demand = trace_demand(cfg);
    let levels = planner::candidate_levels(profile, &PlannerConfig::default(), cfg.devices);
    ensure!(
        !levels.is_empty(),
        "no profiled TP level fits {} devices",
        cfg.devices
    );
    // (tier, tp, group template, share of requests) for SLO tiers with traffic.
    let mut parts: Vec<(usize, u32, Wanted, f64)> = Vec::new();
    let total: f64 = demand
        .iter()
        .zip(&cfg.tiers)
        .filter(|(_, t)| !t.background)
        .map(|(d, _)| d.rate_rps)
        .sum();
    for (i, (tier, d)) in cfg.tiers.iter().zip(&demand).enumerate() {
        if tier.background || d.rate_rps <= 0.0 {
            continue;
        }
        let (tp, est) = best_static(
            profile,
            tier,
            d,
            &levels,
            fixed.get(&tier.name).copied(),
            cfg,
        )?;
        let (max_rps, max_inflight, batch_cap) = est.map_or((0.0, 0.0, 0.0), |e| {
            (e.rps, e.rps * e.residence_s, e.batch_cap)
        });
        let w = Wanted {
            tp,
            role: Role::Mixed,
            tiers: vec![tier.name.clone()],
            accepts_background: true,
            max_rps,
            max_inflight,
            batch_cap,
        };
        parts.push((i, tp, w, d.rate_rps / total));
    }
    // One group per tier first, then each next group to the tier furthest below its share.
    let mut given = vec![0u32; parts.len()];
    let mut free = cfg.devices;
    for (k, p) in parts.iter().enumerate() {
        if p.1 <= free {
            given[k] += p.1;
            free -= p.1;
        }
    }
    loop {
        let n = f64::from(cfg.devices);
        let next = (0..parts.len())
            .filter(|&k| parts[k].1 <= free)
            .max_by(|&a, &b| {
                let gap = |k: usize| parts[k].3 * n - f64::from(given[k]);
                gap(a).total_cmp(&gap(b)).then(b.cmp(&a))
            });
        let Some(k) = next else { break };
        given[k] += parts[k].1;
        free -= parts[k].1;
    }
    let wanted = parts
        .iter()
        .zip(&given)
        .flat_map(|(p, &dev)| (0..dev / p.1).map(move |_| p.2.clone()))
        .collect();
    Ok(finish(placement::place(wanted, cfg.devices, None)))
}

/// The tier's best single TP level for mixed serving (most SLO throughput per device).
fn best_static(
    profile: &Profile,
    tier: &Tier,
    d: &TierDemand,
    levels: &[u32],
    fixed: Option<u32>,
    cfg: &SimConfig,
) -> Result<(u32, Option<efficiency::GroupEstimate>)> {
    let mut shape = TierShape::new(tier, d);
    shape.ttft_ms *= cfg.slo_margin;
    shape.tpot_ms *= cfg.slo_margin;
    let est = |t| efficiency::mixed(profile, t, &shape, f64::from(cfg.chunk_tokens));
    if let Some(t) = fixed {
        check_tp(profile, t, cfg.devices)?;
        return Ok((t, est(t)));
    }
    let best = levels
        .iter()
        .filter_map(|&t| est(t).map(|e| (t, e)))
        .max_by(|a, b| (a.1.rps / f64::from(a.0)).total_cmp(&(b.1.rps / f64::from(b.0))));
    Ok(best.map_or((levels[0], None), |(t, e)| (t, Some(e))))
}
