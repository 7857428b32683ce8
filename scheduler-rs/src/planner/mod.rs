//! Goodput planner (Nitsum §3.3.1, architecture §4 steps 1-4): from the profile, the tiers' SLOs
//! and their current demand, decide the TP level, role and tier of every device group.
//!
//! Pure and allocation-light; the control loop calls it every window and the simulator calls
//! the same function. See docs/planner.md for the definitions and the JSON shapes.

pub mod efficiency;
mod fresh;
pub mod greedy;
mod keep;
pub mod placement;
pub mod strategy;

use std::collections::HashMap;

use crate::plan::Plan;
use crate::profile::{Profile, Shape};
use crate::stats::{LengthStats, TierDemand};
use crate::tiers::Tier;

use efficiency::TierShape;
use fresh::plan_fresh;

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
            prior_lengths: crate::stats::DEFAULT_PRIOR_LENGTHS,
        }
    }
}

impl PlannerConfig {
    /// These settings for a pool whose workers registered `tp_levels` (those whose aligned
    /// groups stay inside one host worker process) and whose prefill groups can reach every
    /// decode group (`kv_linked`: one process, or one KV transport between the processes):
    /// the operator's allowed levels narrowed to the pool's, and no disaggregation unless
    /// linked.
    ///
    /// NOTE: without a link a prefill group in one process and its decode group in another
    /// would decode the request itself, off the plan. With one the planner may place a P/D
    /// bundle across processes whenever that serves best; TP groups never cross them, as
    /// they only get the pool's levels on aligned blocks.
    pub fn for_pool(&self, tp_levels: &[u32], kv_linked: bool) -> PlannerConfig {
        let mut cfg = self.clone();
        cfg.tp_levels = Some(match cfg.tp_levels.take() {
            Some(allowed) => tp_levels
                .iter()
                .copied()
                .filter(|t| allowed.contains(t))
                .collect(),
            None => tp_levels.to_vec(),
        });
        cfg.disaggregation &= kv_linked;
        cfg
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

impl Planned {
    /// Placed groups as the plan after `previous` (epoch + 1, or 1 for a first plan).
    pub fn from_placed(
        placed: Vec<(crate::plan::GroupPlan, f64)>,
        previous: Option<&Plan>,
    ) -> Self {
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

/// Candidate group shapes of the adaptive planner: the TP chain of `candidate_levels`, plus
/// the profile's pipelines whose device count is one of its levels (so sizes stay a
/// divisibility chain), unless `cfg.tp_levels` restricts the plan to TP levels.
pub fn candidate_shapes(profile: &Profile, cfg: &PlannerConfig, devices: u32) -> Vec<Shape> {
    let levels = candidate_levels(profile, cfg, devices);
    let mut out: Vec<Shape> = levels.iter().map(|&t| Shape::from(t)).collect();
    if cfg.tp_levels.is_none() {
        out.extend(
            profile
                .shapes()
                .into_iter()
                .filter(|s| s.pp > 1 && levels.contains(&s.devices())),
        );
    }
    out.sort_by_key(|s| (s.devices(), s.pp));
    out
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
    let levels = candidate_shapes(profile, cfg, devices);
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
            if served(
                tiers,
                &by_name,
                &keep::capacity(tiers, &fresh.plan.groups),
                cfg,
            ) <= served(tiers, &by_name, &k.capacity, cfg) * (1.0 + cfg.switch_gain) =>
        {
            k.planned
        }
        _ => fresh,
    }
}

/// The demand the planner sizes a tier for: its arrival rate / `target_utilization` (0 for a
/// background tier or one without demand).
fn planned_rate(tier: &Tier, demand: Option<&&TierDemand>, cfg: &PlannerConfig) -> f64 {
    match demand {
        Some(d) if !tier.background => {
            d.rate_rps.max(0.0) / cfg.target_utilization.clamp(0.05, 1.0)
        }
        _ => 0.0,
    }
}

/// Weighted planned demand (as the greedy sizes it) that per-tier `capacity` serves.
fn served(
    tiers: &[Tier],
    demand: &HashMap<&str, &TierDemand>,
    capacity: &[f64],
    cfg: &PlannerConfig,
) -> f64 {
    tiers
        .iter()
        .zip(capacity)
        .map(|(t, &cap)| {
            let rate = planned_rate(t, demand.get(t.name.as_str()), cfg);
            t.weight.max(0.0) * rate.min(cap)
        })
        .sum()
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
