//! Shadow runs (issue 10): every layout strategy runs, all the time, in a simulated copy of
//! the pool fed with the *real* arrivals, and the choice follows the one that has served
//! them best lately.
//!
//! The forecast lookahead (`lookahead.rs`) predicts each strategy from the current state on
//! replayed arrivals; its errors (bursts, queues that build up over longer than its horizon,
//! noise under overload) are not the same for every strategy, so it can prefer a layout that
//! a static one beats over the run. A shadow instead *is* the static layout (or the greedy,
//! or Split) run on the very requests the pool received: what it delivered is a measurement
//! of the counterfactual, not a prediction. Following the best shadow with a significance
//! test is the experts setting of online learning: the choice tracks the best strategy in
//! hindsight over the recent past (`memory_s`), and when the tier mix shifts the leader
//! changes with it.
//!
//! Each shadow is a [`Cluster`] (the same Dispatcher, planner and local scheduler as the
//! simulated and the real pool) over `eval_devices` devices, fed every round with the round's
//! arrivals thinned to that share of the pool. A request's prompt is its real one; its output
//! length is not known at arrival and is drawn from its tier's output statistics (the same
//! draw for every shadow, so they differ only by their layout).

mod feed;
mod standings;

use std::collections::VecDeque;

use anyhow::Result;

use crate::planner::strategy::Strategy;

use super::bind_types::BindPolicy;
use super::cluster::Cluster;
use super::draw::{Lengths, Rng};
use super::lookahead::{LookaheadConfig, Situation};
use super::parallel::for_each_parallel;
use super::policy::Policy;
use super::TraceRequest;

/// Seed of the output-length draws: equal arrivals give equal shadows.
const SHADOW_SEED: u64 = 0x5AD0;

/// What the shadows delivered lately, per strategy.
#[derive(Debug, Clone)]
pub struct Standing {
    /// Discounted weighted requests that met their SLOs (or are on track), per strategy.
    pub met: Vec<f64>,
    /// Discounted weighted SLO requests scored.
    pub total: f64,
    /// Discounted SLO requests per second, thinned pool (0 before any was scored).
    pub rate_rps: f64,
}

/// Every strategy's shadow run and what they delivered.
pub struct ShadowBank {
    pub strategies: Vec<Strategy>,
    /// One run per strategy, then (`twins`) each one's binding-off twin.
    pub(super) runs: Vec<Cluster<'static>>,
    /// Binding-off twins follow the runs (a tier has `bind_tp` and the runs bind).
    twins: bool,
    /// Per strategy: discounted weight its run met and its twin did not, the reverse, their
    /// squared weights, and what its twin met (`shadow_binding.rs`).
    pub(super) twin_beats: Vec<[f64; 4]>,
    /// Pool devices and TP levels the bank was made for (re-made when they change).
    devices: u32,
    levels: Vec<u32>,
    /// Share of the arrivals fed (eval devices / pool devices).
    scale: f64,
    /// Per tier: thinning accumulator (every (1/scale)-th arrival is kept).
    keep: Vec<f64>,
    rng: Rng,
    start: f64,
    fed_until: f64,
    /// (arrival, tier) of the requests fed and not scored yet, in order; the first has index
    /// `scored` (all runs share the indices).
    fed: VecDeque<(f64, usize)>,
    scored: usize,
    scored_at: f64,
    pub(super) met: Vec<f64>,
    pub(super) total: f64,
    /// `beats[i][j]`: discounted weight of requests strategy `i` met and `j` did not, and
    /// the sum of squared weights (the variance of a sign test on them).
    beats: Vec<Vec<f64>>,
    beats_sq: Vec<Vec<f64>>,
    /// Discounted SLO requests per second scored, as of the last `advance`.
    rate_rps: f64,
}

impl std::fmt::Debug for ShadowBank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShadowBank")
            .field("strategies", &self.strategies)
            .field("fed", &self.fed.len())
            .field("met", &self.met)
            .finish_non_exhaustive()
    }
}

impl ShadowBank {
    /// A bank for the pool of `s`, started at `start` (before any arrival it is fed).
    pub fn new(s: &Situation, cfg: &LookaheadConfig, start: f64) -> Result<Self> {
        let strategies = Strategy::all(s.levels);
        let largest = s.levels.iter().copied().max().unwrap_or(1);
        let eval = cfg.eval_devices.max(largest).min(s.devices).max(1);
        let twins =
            s.knobs.binding != BindPolicy::Off && s.tiers.iter().any(|t| t.bind_tp.is_some());
        let bindings: &[BindPolicy] = if twins {
            &[s.knobs.binding, BindPolicy::Off]
        } else {
            &[s.knobs.binding]
        };
        let runs = bindings
            .iter()
            .flat_map(|&b| strategies.iter().map(move |&st| (b, st)))
            .map(|(binding, st)| {
                // A live policy: the shadow re-plans its strategy every window, as the pool
                // would; no requests yet, they are fed as they arrive.
                let mut sim = s.sim_config(
                    eval,
                    Policy::Fixed(Strategy::Greedy),
                    Vec::new(),
                    s.knobs.window_s,
                );
                sim.binding = binding;
                Cluster::shadow(sim, st, s.planner.clone(), start)
            })
            .collect::<Result<Vec<_>>>()?;
        let k = strategies.len();
        Ok(ShadowBank {
            strategies,
            runs,
            twins,
            twin_beats: vec![[0.0; 4]; if twins { k } else { 0 }],
            devices: s.devices,
            levels: s.levels.to_vec(),
            scale: f64::from(eval) / f64::from(s.devices.max(1)),
            keep: vec![0.5; s.tiers.len()],
            rng: Rng::new(SHADOW_SEED),
            start,
            fed_until: start,
            fed: VecDeque::new(),
            scored: 0,
            scored_at: start,
            met: vec![0.0; k],
            total: 0.0,
            beats: vec![vec![0.0; k]; k],
            beats_sq: vec![vec![0.0; k]; k],
            rate_rps: 0.0,
        })
    }

    /// Whether the bank was made for this pool (devices and levels).
    pub fn fits(&self, s: &Situation) -> bool {
        self.devices == s.devices && self.levels == s.levels
    }

    /// Feed the arrivals of `s` since the last call, run every shadow to `now` and score the
    /// requests old enough to be judged (`settle`).
    pub fn advance(&mut self, s: &Situation, cfg: &LookaheadConfig, now: f64) {
        self.run_to(s, now);
        self.score(s, cfg, now);
        for run in &mut self.runs {
            run.forget_resolved(self.scored);
        }
    }

    /// Feed the arrivals of `s` since the last call and run every shadow to `now`.
    pub fn run_to(&mut self, s: &Situation, now: f64) {
        if now <= self.fed_until {
            return;
        }
        let mut new: Vec<(f64, usize, f64)> = s
            .recent
            .iter()
            .map(|r| (now - r.age_s, r.tier, r.prompt))
            .filter(|&(t, _, _)| t > self.fed_until + 1e-9 && t <= now)
            .collect();
        new.sort_by(|a, b| a.0.total_cmp(&b.0));
        // Each tier's output lengths, from its (censored) statistics or the prior.
        let prior = s.planner.prior_lengths.1;
        let outputs: Vec<Lengths> = s
            .tiers
            .iter()
            .map(|t| {
                s.demand
                    .iter()
                    .find(|d| d.tier == t.name)
                    .map_or(Lengths::prior(prior), |d| Lengths::new(&d.output, prior))
            })
            .collect();
        for (t, tier, prompt) in new {
            self.keep[tier] += self.scale;
            if self.keep[tier] < 1.0 {
                continue;
            }
            self.keep[tier] -= 1.0;
            let output = outputs[tier].one(&mut self.rng);
            let req = TraceRequest {
                arrival_s: t,
                input_len: prompt.round().clamp(1.0, 1e7) as u32,
                output_len: output,
                tier: s.tiers[tier].name.clone(),
                leftover: false,
            };
            for run in &mut self.runs {
                run.feed(&req);
            }
            self.fed.push_back((t, tier));
        }
        self.fed_until = now;
        for_each_parallel(&mut self.runs, |run| run.advance_shadow(now));
    }

    /// What the shadows delivered, as of the last `advance`.
    pub fn standing(&self) -> Standing {
        Standing {
            met: self.met.clone(),
            total: self.total,
            rate_rps: self.rate_rps,
        }
    }

    /// Requests the largest shadow run still holds (a run under lasting overload holds its
    /// growing backlog; the chooser re-makes the bank past a bound).
    pub fn held(&self) -> usize {
        self.runs
            .iter()
            .map(|r| r.reqs.len() - r.reqs.first())
            .max()
            .unwrap_or(0)
    }

    /// Share of the pool a shadow stands for (eval devices / pool devices): a shadow's rates
    /// divided by it are the pool's.
    pub fn scale(&self) -> f64 {
        self.scale
    }
}

#[cfg(test)]
mod tests;
