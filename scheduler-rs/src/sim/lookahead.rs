//! The forecast choice (issue 10; `choice: "forecast"`, the default is the shadow choice of
//! [`super::shadow`]; the knobs of both are [`super::lookahead_config`]): every selection
//! round, each layout strategy ([`Strategy`]: the greedy planner, each fixed TP level, each
//! static TP level, Split) is planned for a small copy of the pool and *simulated* over the
//! next `horizon_s` of forecast arrivals plus the requests in flight ([`forecast`]). The
//! strategy with the most predicted goodput wins, minus what switching to it costs; the
//! current strategy is kept unless another predicts more than `switch_margin` more.
//!
//! Which candidates a round predicts and how the choice keeps or switches across rounds is
//! [`super::chooser`].
//!
//! The predictor is the simulator itself (the same Dispatcher and local scheduler as the
//! cluster run), so it agrees with the engine model by construction, and every static layout
//! is a candidate: the choice is never one the predictor itself rates below a static layout.
//! The cost is bounded by `eval_devices` and `horizon_s`, not by the pool size.

use serde::{Deserialize, Serialize};

use crate::plan::Plan;
use crate::planner::strategy::{plan_strategy, Strategy};
use crate::planner::PlannerConfig;
use crate::profile::Profile;
use crate::stats::TierDemand;
use crate::tiers::Tier;

use super::forecast::{forecast, ForecastSpec, InFlight, RecentArrival};
pub use super::lookahead_config::{ChoiceKind, EngineKnobs, ForecastKind, LookaheadConfig};
use super::parallel::parallel_map;
use super::policy::Policy;
use super::{simulate_outcomes, SimConfig, TraceRequest};

/// The forecast's fixed seed: equal situations give equal choices.
pub const FORECAST_SEED: u64 = 0x5EED;

/// Everything one selection round looks at.
pub struct Situation<'a> {
    pub profile: &'a Profile,
    pub tiers: &'a [Tier],
    pub demand: &'a [TierDemand],
    pub inflight: &'a [InFlight],
    /// Arrivals of the last seconds (at least `horizon_s × 2 × surge` of them for the replay
    /// forecast; empty: Poisson).
    pub recent: &'a [RecentArrival],
    /// Seconds over which arrivals have been observed (the run's age).
    pub history_s: f64,
    pub devices: u32,
    pub levels: &'a [u32],
    pub planner: &'a PlannerConfig,
    pub knobs: EngineKnobs,
}

impl Situation<'_> {
    /// A simulation of `devices` of this pool (its profile, tiers, engine and planner
    /// settings) under `policy`, re-planning every `window_s`: what the predictions and the
    /// shadow runs simulate.
    pub(super) fn sim_config(
        &self,
        devices: u32,
        policy: Policy,
        requests: Vec<TraceRequest>,
        window_s: f64,
    ) -> SimConfig {
        SimConfig {
            profile: self.profile.file().clone(),
            tiers: self.tiers.to_vec(),
            devices,
            policy,
            requests,
            window_s,
            switch_ms: self.knobs.switch_ms,
            kv_bytes_per_token: self.knobs.kv_bytes_per_token,
            kv_bandwidth_gbps: self.knobs.kv_bandwidth_gbps,
            chunk_tokens: self.knobs.chunk_tokens,
            prefill_budget_tokens: self.knobs.prefill_budget_tokens,
            drain_s: f64::INFINITY,
            records: false,
            slo_margin: self.planner.slo_margin,
            target_utilization: self.planner.target_utilization,
            lookahead: LookaheadConfig::default(),
            binding: self.knobs.binding,
            seed: 0,
        }
    }
}

/// One candidate's prediction, full-pool scale.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    pub strategy: String,
    /// Predicted weighted SLO goodput over the horizon, requests/s.
    pub goodput_rps: f64,
    /// Predicted met / forecast requests.
    pub attainment: f64,
    /// Goodput the switch to it would cost (0 for the current strategy), requests/s.
    pub switch_cost_rps: f64,
    /// Predicted goodput under the surge forecast (`surge` × the rate), requests/s.
    pub surge_goodput_rps: f64,
    /// Running average of `bias × (goodput_rps + surge_goodput_rps / surge) / 2 -
    /// switch_cost_rps` over the rounds: what the choice compares.
    pub smoothed_rps: f64,
    /// Delivered / predicted goodput of this strategy the last times it ran (1 until then).
    pub bias: f64,
    /// Whether it was predicted this round (false: the numbers are from the round it last
    /// was, and it cannot win this one).
    pub fresh: bool,
}

/// `demand` with every tier's rate × `factor`.
fn scaled(demand: &[TierDemand], factor: f64) -> Vec<TierDemand> {
    demand
        .iter()
        .map(|d| TierDemand {
            rate_rps: d.rate_rps * factor,
            ..d.clone()
        })
        .collect()
}

/// Predict the `wanted` ones of `Strategy::all(s.levels)` (with switch costs relative to
/// `current`), and any other whose plan is the same as a wanted one's; `None` for the rest.
pub(super) fn predict_all(
    s: &Situation,
    cfg: &LookaheadConfig,
    current: Option<Strategy>,
    wanted: &[bool],
) -> Vec<Option<Candidate>> {
    let strategies = Strategy::all(s.levels);
    let largest = s.levels.iter().copied().max().unwrap_or(1);
    let eval = cfg.eval_devices.max(largest).min(s.devices).max(1);
    let scale = f64::from(eval) / f64::from(s.devices);
    // NOTE: the next windows' rate is uncertain (bursts): each candidate is also predicted
    // with the arrivals of a surge (`surge` × the rate), and the choice averages the two (the
    // surge's per unit of offered load). A layout that only holds at exactly the observed
    // rate (FCFS without admission) then loses to one that degrades gracefully.
    let forecasts: Vec<Vec<TraceRequest>> = [1.0, cfg.surge]
        .iter()
        .map(|&k| {
            // Arrivals go on for a second horizon so that the scored ones (those of the first)
            // compete with later load as they would in the real run, not with a draining pool.
            let spec = ForecastSpec {
                horizon_s: 2.0 * cfg.horizon_s,
                rate_factor: k,
                replay: cfg.forecast == ForecastKind::Replay && !s.recent.is_empty(),
                history_s: s.history_s,
                scale,
                prior_lengths: s.planner.prior_lengths,
                seed: FORECAST_SEED,
            };
            forecast(s.tiers, s.demand, s.inflight, s.recent, &spec)
        })
        .collect();
    let demand = scaled(s.demand, scale);
    let plans: Vec<_> = strategies
        .iter()
        .map(|&st| plan_strategy(st, s.profile, s.tiers, &demand, eval, None, s.planner))
        .collect();
    let current_plan = current
        .and_then(|c| strategies.iter().position(|&x| x == c))
        .map(|i| &plans[i].plan);
    // KV in flight: decoding requests hold their prompt (the tier's mean) plus their output.
    let mean_prompt = |tier: usize| {
        let name = &s.tiers[tier].name;
        s.demand
            .iter()
            .find(|d| &d.tier == name)
            .map_or(s.planner.prior_lengths.0, |d| d.prompt.mean)
    };
    let inflight_tokens = s
        .inflight
        .iter()
        .filter(|r| r.generated > 0.0)
        .map(|r| r.generated + mean_prompt(r.tier))
        .sum::<f64>();
    let mut candidates = Vec::with_capacity(strategies.len());
    // Strategies often make the same plan (the greedy at one level, split = greedy per tier):
    // each distinct plan is simulated once, and the distinct ones in parallel.
    let first_of: Vec<usize> = (0..plans.len())
        .map(|k| (0..k).find(|&j| plans[j] == plans[k]).unwrap_or(k))
        .collect();
    let distinct: Vec<usize> = (0..plans.len())
        .filter(|&k| first_of[k] == k && (k..plans.len()).any(|j| first_of[j] == k && wanted[j]))
        .collect();
    // One job per (plan, forecast): the threads share the round's simulations evenly.
    let jobs: Vec<(usize, usize)> = distinct.iter().flat_map(|&k| [(k, 0), (k, 1)]).collect();
    let simulated = parallel_map(&jobs, |&(k, f)| {
        predict(s, cfg, &plans[k], eval, &forecasts[f])
    });
    let predicted: Vec<(f64, f64, f64)> = simulated
        .chunks(2)
        .map(|x| (x[0].0 / scale, x[0].1, x[1].0 / scale))
        .collect();
    for (k, (st, planned)) in strategies.iter().zip(plans.iter()).enumerate() {
        let Some(at) = distinct.iter().position(|&j| j == first_of[k]) else {
            candidates.push(None);
            continue;
        };
        let (goodput, attainment, surge_goodput) = predicted[at];
        let (moved, moved_tp) =
            current_plan.map_or((0.0, 0.0), |c| moved_share(c, &planned.plan, eval));
        // NOTE: a switch pauses each new group for the TP switch plus the KV it receives, in
        // one aggregated transfer per group (as `reconfigure.rs` does): about its devices'
        // share of the KV in flight. Groups receive in parallel, so the pause does not grow
        // with the pool (charging the whole pool's KV to one transfer priced every switch
        // at 64 devices above its goodput). Goodput lost ≈ moved share × pause / horizon.
        let kv_per_device = inflight_tokens / f64::from(s.devices.max(1));
        let kv_s = moved_tp * kv_per_device * s.knobs.kv_bytes_per_token
            / (s.knobs.kv_bandwidth_gbps * 1e9);
        let pause_s = if moved > 0.0 {
            s.knobs.switch_ms / 1e3 + kv_s
        } else {
            0.0
        };
        // NOTE: every candidate starts from the same re-created in-flight requests, so the
        // forecast does not see a re-layout's disruption (re-dispatched queues, migrated
        // batches ramping up under new caps): each moved device is also charged
        // `move_penalty` of its predicted goodput.
        let cost = goodput * moved * ((pause_s / cfg.horizon_s).min(1.0) + cfg.move_penalty);
        candidates.push(Some(Candidate {
            strategy: st.name(),
            goodput_rps: goodput,
            attainment,
            switch_cost_rps: cost,
            surge_goodput_rps: surge_goodput,
            smoothed_rps: goodput - cost,
            bias: 1.0,
            fresh: true,
        }));
    }
    candidates
}

/// Simulate one candidate plan on the forecast: (weighted met per second, attainment).
fn predict(
    s: &Situation,
    cfg: &LookaheadConfig,
    planned: &crate::planner::Planned,
    devices: u32,
    requests: &[TraceRequest],
) -> (f64, f64) {
    if planned.plan.groups.is_empty() || requests.is_empty() {
        return (0.0, 0.0);
    }
    let policy = Policy::FixedPlan {
        plan: planned.plan.named(s.tiers),
        batch_caps: planned.batch_caps.clone(),
        reject_best_effort: false,
    };
    let mut sim = s.sim_config(devices, policy, requests.to_vec(), cfg.horizon_s);
    sim.drain_s = cfg.horizon_s;
    let Ok(outcomes) = simulate_outcomes(&sim) else {
        return (0.0, 0.0);
    };
    // Scored: the requests arriving within the horizon (those in flight only load the
    // layout): what the run's delivered goodput can be checked against (`Chooser::learn`).
    let weight: Vec<f64> = s
        .tiers
        .iter()
        .map(|t| if t.background { 0.0 } else { t.weight })
        .collect();
    let scored = outcomes.iter().filter(|x| x.0 > 0.0 && x.0 < cfg.horizon_s);
    let (mut met, mut n) = (0.0, 0.0);
    for &(_, tier, ok) in scored {
        n += weight[tier.index()];
        if ok {
            met += weight[tier.index()];
        }
    }
    let attainment = if n > 0.0 { met / n } else { 0.0 };
    (met / cfg.horizon_s, attainment)
}

/// Share of the `devices` whose group (members, TP, role) differs between two plans, and
/// the moved devices' mean group size (the TP of a moved device's new group, on average).
fn moved_share(a: &Plan, b: &Plan, devices: u32) -> (f64, f64) {
    let same = |g: &crate::plan::GroupPlan| {
        a.groups
            .iter()
            .any(|h| h.members == g.members && h.role == g.role)
    };
    let (mut moved, mut weighted_tp) = (0usize, 0usize);
    for g in b.groups.iter().filter(|g| !same(g)) {
        moved += g.members.len();
        weighted_tp += g.members.len() * g.members.len();
    }
    if moved == 0 {
        return (0.0, 0.0);
    }
    let share = moved as f64 / f64::from(devices.max(1));
    (share, weighted_tp as f64 / moved as f64)
}

#[cfg(test)]
#[path = "lookahead_tests.rs"]
pub(crate) mod tests;
