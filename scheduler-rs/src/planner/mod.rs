//! Goodput planner (Nitsum §3.3.1, DESIGN §4 steps 1-4): from the profile, the tiers' SLOs
//! and their current demand, decide the TP level, role and tier of every device group.
//!
//! Pure and allocation-light; the control loop calls it every window and the simulator calls
//! the same function. See docs/planner.md for the definitions and the JSON shapes.

pub mod efficiency;
pub mod greedy;
mod keep;
pub mod placement;

use std::collections::HashMap;

use crate::plan::{Plan, Role};
use crate::profile::Profile;
use crate::stats::{LengthStats, TierDemand};
use crate::tiers::Tier;

use efficiency::{GroupEstimate, TierShape};
use greedy::Unit;
use placement::Wanted;

/// Planner knobs (JSON: any subset of the fields; the rest keep their defaults).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct PlannerConfig {
    /// TP levels allowed (by the model and the operator); `None`: all profiled levels.
    /// A single level is the "no dynamic TP" ablation.
    pub tp_levels: Option<Vec<u32>>,
    /// Fraction of TTFT a prefill batch may take (the rest covers waiting for the batch ahead).
    pub prefill_slack: f64,
    /// Largest number of prompts batched into one prefill forward.
    pub max_prefill_batch: u32,
    /// Whether prefill/decode disaggregated bundles are candidates.
    pub disaggregation: bool,
    /// Prefill token budget per iteration of a mixed group's local scheduler.
    pub chunk_tokens: f64,
    /// Plan against `margin × SLO` (TTFT and TPOT): headroom for queueing jitter, KV
    /// handoffs and length variance the mean-based estimates do not see.
    pub slo_margin: f64,
    /// Plan SLO groups for `demand / target_utilization`: groups sized at exactly 100% of
    /// their SLO capacity queue (and miss TTFT) on every burst. 1.0 plans the bare demand.
    pub target_utilization: f64,
    /// Hysteresis: keep the previous plan while every tier's rate is at most this fraction of
    /// its capacity under it (re-estimated with the current lengths). 0 re-plans every window.
    pub keep_utilization: f64,
    /// Hysteresis under load: when the previous plan no longer serves the demand, switch only
    /// to a plan that serves more than `1 + switch_gain` times as much of it.
    pub switch_gain: f64,
    /// Request shape (mean prompt, mean output tokens) assumed where none was observed yet: a
    /// tier's output lengths before its first completion, and the TP level of the best-effort
    /// groups that serve the first window.
    pub prior_lengths: (f64, f64),
}

impl Default for PlannerConfig {
    fn default() -> Self {
        PlannerConfig {
            tp_levels: None,
            prefill_slack: 0.5,
            max_prefill_batch: 64,
            disaggregation: true,
            chunk_tokens: 512.0,
            slo_margin: 1.0,
            target_utilization: 0.5,
            keep_utilization: 0.9,
            switch_gain: 0.1,
            prior_lengths: (1024.0, 256.0),
        }
    }
}

/// A plan plus what the local schedulers need from it.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    pub plan: Plan,
    /// Per group (same order as `plan.groups`): decode batch cap that keeps the group's tier
    /// within TPOT; 0 for prefill-only and best-effort groups (no SLO cap).
    pub batch_caps: Vec<f64>,
}

/// Candidate TP levels: profiled ∩ allowed, ≤ `devices`, reduced to a divisibility chain
/// (each kept level divides the next) so aligned placement can never fragment.
pub fn candidate_levels(profile: &Profile, cfg: &PlannerConfig, devices: u32) -> Vec<u32> {
    let mut out: Vec<u32> = Vec::new();
    for t in profile.tp_levels() {
        let allowed = cfg.tp_levels.as_ref().is_none_or(|l| l.contains(&t));
        if allowed && t <= devices && out.last().is_none_or(|&prev| t % prev == 0) {
            out.push(t);
        }
    }
    out
}

/// Disaggregated candidates of tier `i` that fit `devices`: the most device-efficient bundle
/// over all (prefill, decode) level pairs, and the smallest one (fewest devices, then most
/// efficient) so a small pool or the seeding round still finds a bundle that fits. More would
/// only slow the greedy down.
fn bundles(
    i: usize,
    pre: &[(u32, GroupEstimate)],
    dec: &[(u32, GroupEstimate)],
    devices: u32,
) -> Vec<Unit> {
    let (mut best, mut smallest): (Option<Unit>, Option<Unit>) = (None, None);
    for &p in pre {
        for &d in dec {
            let Some(u) = Unit::disaggregated(i, p, d, devices) else {
                continue;
            };
            if best
                .as_ref()
                .is_none_or(|b| u.efficiency() > b.efficiency())
            {
                best = Some(u.clone());
            }
            // The fewest devices any bundle of this pair can use: one group of each.
            let Some(one) = Unit::disaggregated(i, p, d, p.0 + d.0) else {
                continue;
            };
            let better = smallest
                .as_ref()
                .is_none_or(|s| (one.devices, -one.efficiency()) < (s.devices, -s.efficiency()));
            if better {
                smallest = Some(one);
            }
        }
    }
    let mut out: Vec<Unit> = best.into_iter().collect();
    out.extend(smallest.filter(|s| out.first() != Some(s)));
    out
}

/// TP level for groups planned without any demand: the most device-efficient mixed level for
/// the tier with the tightest TPOT under `cfg.prior_lengths`, or the smallest level that
/// meets its SLOs at all; `None` when no level does (or no tier has an SLO).
fn idle_level(
    profile: &Profile,
    tiers: &[Tier],
    levels: &[u32],
    cfg: &PlannerConfig,
) -> Option<u32> {
    let tightest = tiers
        .iter()
        .filter(|t| !t.background)
        .min_by(|a, b| a.tpot_ms.total_cmp(&b.tpot_ms))?;
    let (prompt, output) = cfg.prior_lengths;
    let prior = TierDemand {
        tier: tightest.name.clone(),
        rate_rps: 0.0,
        prompt: LengthStats::constant(prompt),
        output: LengthStats::constant(output),
    };
    let shape = shape(tightest, &prior, cfg);
    levels
        .iter()
        .filter_map(|&t| {
            efficiency::mixed(profile, t, &shape, cfg.chunk_tokens)
                .map(|e| (t, e.rps / f64::from(t)))
        })
        .max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0)))
        .map(|(t, _)| t)
}

/// A tier's planning shape under `cfg` (SLOs scaled by `slo_margin`). Lengths not observed
/// yet take `cfg.prior_lengths`.
/// NOTE: output lengths come from completions, so a tier's first window has arrivals but no
/// outputs: planning that as 1-token outputs makes decode look free and sizes every group for
/// prefill alone (the simulator's Azure conv runs collapsed into TP-1 groups that way).
fn shape(tier: &Tier, d: &TierDemand, cfg: &PlannerConfig) -> TierShape {
    let unknown = |l: &LengthStats| l.count == 0 && l.mean <= 0.0;
    let mut d = d.clone();
    if unknown(&d.prompt) {
        d.prompt = LengthStats::constant(cfg.prior_lengths.0);
    }
    if unknown(&d.output) {
        d.output = LengthStats::constant(cfg.prior_lengths.1);
    }
    let mut s = TierShape::new(tier, &d);
    s.ttft_ms *= cfg.slo_margin;
    s.tpot_ms *= cfg.slo_margin;
    s
}

/// Plan `devices` devices for `tiers` under `demand` (matched by tier name; tiers without an
/// entry have no demand). `previous` is kept outright while it still serves the demand
/// (`keep_utilization`), and otherwise lets placement keep existing groups.
pub fn plan(
    profile: &Profile,
    tiers: &[Tier],
    demand: &[TierDemand],
    devices: u32,
    previous: Option<&Plan>,
    cfg: &PlannerConfig,
) -> Planned {
    let levels = candidate_levels(profile, cfg, devices);
    let by_name: HashMap<&str, &TierDemand> = demand.iter().map(|d| (d.tier.as_str(), d)).collect();
    let kept = previous
        .filter(|_| cfg.keep_utilization > 0.0)
        .and_then(|prev| keep::reevaluate(profile, tiers, &by_name, devices, prev, cfg, &levels));
    if let Some(k) = kept
        .as_ref()
        .filter(|k| k.serves(tiers, &by_name, cfg.keep_utilization))
    {
        return k.planned.clone();
    }
    let fresh = plan_fresh(profile, tiers, &by_name, devices, previous, cfg, &levels);
    match kept {
        // NOTE: a re-plan moves devices and KV and stalls their requests; under overload the
        // window-to-window noise in rates and lengths would otherwise swing the layout every
        // window without serving more.
        Some(k)
            if served(tiers, &by_name, &fresh.plan.groups, cfg)
                <= served(tiers, &by_name, &k.planned.plan.groups, cfg)
                    * (1.0 + cfg.switch_gain) =>
        {
            k.planned
        }
        _ => fresh,
    }
}

/// Weighted demand (arrival rate / `target_utilization`, as the greedy plans it) that `groups`
/// serve within their SLO capacity.
fn served(
    tiers: &[Tier],
    demand: &HashMap<&str, &TierDemand>,
    groups: &[crate::plan::GroupPlan],
    cfg: &PlannerConfig,
) -> f64 {
    let utilization = cfg.target_utilization.clamp(0.05, 1.0);
    tiers
        .iter()
        .zip(keep::capacity(tiers, groups))
        .filter(|(t, _)| !t.background)
        .map(|(t, cap)| {
            let rate = demand.get(t.name.as_str()).map_or(0.0, |d| d.rate_rps) / utilization;
            t.weight.max(0.0) * rate.min(cap)
        })
        .sum()
}

/// The planner proper (steps 1-4), without hysteresis.
fn plan_fresh(
    profile: &Profile,
    tiers: &[Tier],
    by_name: &HashMap<&str, &TierDemand>,
    devices: u32,
    previous: Option<&Plan>,
    cfg: &PlannerConfig,
    levels: &[u32],
) -> Planned {
    let mut rates = Vec::with_capacity(tiers.len());
    let mut weights = Vec::with_capacity(tiers.len());
    let mut units: Vec<Unit> = Vec::new();
    let mut best_mixed: Vec<Option<(u32, f64)>> = Vec::with_capacity(tiers.len());
    for (i, tier) in tiers.iter().enumerate() {
        let d = by_name.get(tier.name.as_str());
        let rate = match d {
            Some(d) if !tier.background => {
                d.rate_rps.max(0.0) / cfg.target_utilization.clamp(0.05, 1.0)
            }
            _ => 0.0,
        };
        rates.push(rate);
        weights.push(tier.weight.max(0.0));
        best_mixed.push(None);
        let (Some(d), false) = (d, tier.background) else {
            continue;
        };
        let shape = shape(tier, d, cfg);
        let mut pre: Vec<(u32, GroupEstimate)> = Vec::new();
        let mut dec: Vec<(u32, GroupEstimate)> = Vec::new();
        for &t in levels {
            if let Some(e) = efficiency::mixed(profile, t, &shape, cfg.chunk_tokens) {
                let per_dev = e.rps / f64::from(t);
                if best_mixed[i].is_none_or(|(_, b)| per_dev > b) {
                    best_mixed[i] = Some((t, per_dev));
                }
                units.push(Unit::mixed(i, t, e));
            }
            if cfg.disaggregation {
                let slack = cfg.prefill_slack;
                pre.extend(
                    efficiency::prefill(profile, t, &shape, slack, cfg.max_prefill_batch)
                        .map(|e| (t, e)),
                );
                dec.extend(efficiency::decode(profile, t, &shape).map(|e| (t, e)));
            }
        }
        units.extend(bundles(i, &pre, &dec, devices));
    }
    let (picks, mut free) = greedy::assign(&units, &rates, &weights, devices);

    let mut wanted: Vec<Wanted> = Vec::new();
    for &k in &picks {
        let u = &units[k];
        for g in &u.groups {
            wanted.push(Wanted {
                tp: g.tp,
                role: g.role,
                tiers: vec![tiers[u.tier].name.clone()],
                accepts_background: false,
                max_rps: g.est.rps,
                max_inflight: g.est.rps * g.est.residence_s,
                batch_cap: g.est.batch_cap,
            });
        }
    }
    // Leftover devices: best-effort/background groups at the level that is most efficient for
    // the busiest tier (largest first when that level no longer fits). With no demand at all
    // (start-up, idle), for the tightest tier under the prior request shape: the first window
    // of a burst lands on these groups, and TP 1 groups under a strict TPOT can sink it.
    let busiest = (0..tiers.len())
        .filter(|&i| best_mixed[i].is_some())
        .max_by(|&a, &b| rates[a].total_cmp(&rates[b]).then(b.cmp(&a)));
    let leftover_tp = match busiest {
        Some(i) => best_mixed[i].map(|(t, _)| t),
        None if rates.iter().all(|&r| r <= 0.0) => idle_level(profile, tiers, levels, cfg),
        None => None,
    }
    .or(levels.first().copied());
    let mut any_leftover = false;
    for &t in levels.iter().rev() {
        if leftover_tp.is_some_and(|l| t > l) {
            continue;
        }
        while free >= t {
            free -= t;
            any_leftover = true;
            wanted.push(Wanted {
                tp: t,
                role: Role::Mixed,
                tiers: Vec::new(),
                accepts_background: true,
                max_rps: 0.0,
                max_inflight: 0.0,
                batch_cap: 0.0,
            });
        }
    }
    if !any_leftover {
        // NOTE: background requests must always have somewhere to go; local schedulers run
        // them only in batch slots the feasible and best-effort queues leave empty.
        for w in wanted.iter_mut().filter(|w| w.role != Role::Decode) {
            w.accepts_background = true;
        }
    }
    let placed = placement::place(wanted, devices, previous);
    let (groups, batch_caps) = placed.into_iter().unzip();
    Planned {
        plan: Plan {
            epoch: previous.map_or(1, |p| p.epoch + 1),
            groups,
        },
        batch_caps,
    }
}

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
        .map(serde_json::from_str)
        .transpose()
        .context("plan: invalid previous plan JSON")?;
    let cfg: PlannerConfig = config_json
        .map(serde_json::from_str)
        .transpose()
        .context("plan: invalid planner config JSON")?
        .unwrap_or_default();
    anyhow::ensure!(devices > 0, "plan: num_devices must be positive");
    let out = plan(&profile, &tiers, &demand, devices, previous.as_ref(), &cfg);
    Ok(serde_json::to_string(&serde_json::json!({
        "epoch": out.plan.epoch,
        "groups": out.plan.groups,
        "batch_caps": out.batch_caps,
    }))?)
}

#[cfg(test)]
mod tests;
