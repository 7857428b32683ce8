//! The workload the lookahead predicts on: the next `horizon_s` of arrivals, plus the
//! requests already in flight, thinned to a smaller pool. Arrivals either replay the recent
//! ones (their times and prompts: bursts and the real length mix included) or are drawn
//! Poisson at the window's rate with log-normal lengths.
//!
//! Pure and deterministic (a fixed-seed generator): equal inputs give equal forecasts, so the
//! router and the simulator make the same choice from the same state.

use crate::stats::TierDemand;
use crate::tiers::Tier;

use super::draw::{tokens, Lengths, Rng};
use super::TraceRequest;

/// A request in flight now: its tier and the output tokens it generated so far (0: it has
/// not had its first token yet, i.e. it is still waiting or prefilling).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct InFlight {
    pub tier: usize,
    pub generated: f64,
    /// Seconds since it arrived: a waiting request keeps its TTFT clock.
    pub age_s: f64,
    /// Whether it holds SLO bandwidth (dispatched feasible, not demoted). One that does not
    /// runs on leftover capacity, and is re-created so.
    pub feasible: bool,
}

/// A request that arrived recently: the replay forecast's material.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RecentArrival {
    pub tier: usize,
    /// Seconds before now.
    pub age_s: f64,
    pub prompt: f64,
}

/// `(tier name, seconds ago, prompt tokens)` arrivals (`WindowStats::recent_arrivals`) with
/// their tiers as indices into `tiers`; arrivals of unknown tiers are left out.
pub fn recent_of(tiers: &[Tier], arrivals: &[(&str, f64, f64)]) -> Vec<RecentArrival> {
    arrivals
        .iter()
        .filter_map(|&(name, age_s, prompt)| {
            let tier = tiers.iter().position(|t| t.name == name)?;
            Some(RecentArrival {
                tier,
                age_s,
                prompt,
            })
        })
        .collect()
}

/// What to forecast.
#[derive(Debug, Clone, Copy)]
pub struct ForecastSpec {
    /// Seconds of future arrivals.
    pub horizon_s: f64,
    /// Arrival-rate multiplier (1: the observed rate; a surge above 1).
    pub rate_factor: f64,
    /// Replay the recent arrivals (times compressed by `rate_factor`) instead of drawing
    /// Poisson ones.
    pub replay: bool,
    /// Seconds over which arrivals have been observed (since the run started): a replay
    /// longer than that repeats what there is.
    pub history_s: f64,
    /// Fraction of the pool simulated (`eval devices / devices`): arrivals and in-flight
    /// requests are thinned by it, so per-device load is the real one.
    pub scale: f64,
    /// Shape (prompt, output) for tiers without observed lengths.
    pub prior_lengths: (f64, f64),
    /// Generator seed (the lookahead uses a fixed one; tests draw independent traces).
    pub seed: u64,
}

/// The forecast requests, sorted by arrival (in-flight ones at or before 0).
///
/// NOTE: a replayed arrival keeps its prompt and its place in time: the next `horizon_s`
/// look like the last `horizon_s × rate_factor` seconds, compressed by `rate_factor` (the
/// recent past is the best short-term forecast of a bursty trace; a Poisson stream at one
/// window's rate misses both the bursts and the rate's noise). Output lengths are not known
/// at arrival and are drawn from the tier's (censored) output statistics either way.
///
/// NOTE: a request in flight is re-created: one still waiting arrives at `-age_s` with a
/// fresh prompt (so one already past its TTFT counts as missed whatever the layout), one
/// decoding arrives at 0 with a 1-token prompt and its expected
/// remaining output (the tier's mean output minus what it generated, at least 2 tokens), so
/// the candidate layouts start from the load they would inherit.
pub fn forecast(
    tiers: &[Tier],
    demand: &[TierDemand],
    inflight: &[InFlight],
    recent: &[RecentArrival],
    spec: &ForecastSpec,
) -> Vec<TraceRequest> {
    let mut out = Vec::new();
    let mut rng = Rng::new(spec.seed);
    for (i, tier) in tiers.iter().enumerate() {
        let Some(d) = demand.iter().find(|d| d.tier == tier.name) else {
            continue;
        };
        let prompts = Lengths::new(&d.prompt, spec.prior_lengths.0);
        let outputs = Lengths::new(&d.output, spec.prior_lengths.1);
        // In flight: every (1/scale)-th request of this tier, deterministically.
        let mine: Vec<&InFlight> = inflight.iter().filter(|r| r.tier == i).collect();
        let keep = thin(mine.len(), spec.scale);
        let ins = prompts.draw(&mut rng, keep.len());
        let outs = outputs.draw(&mut rng, keep.len());
        for (k, &j) in keep.iter().enumerate() {
            let r = mine[j];
            let (input, output) = if r.generated <= 0.0 {
                (tokens(ins[k]), tokens(outs[k]))
            } else {
                (1, tokens((outputs.mean - r.generated).max(2.0)))
            };
            out.push(TraceRequest {
                arrival_s: if r.generated <= 0.0 {
                    -r.age_s.max(0.0)
                } else {
                    0.0
                },
                input_len: input,
                output_len: output.max(1),
                tier: tier.name.clone(),
                leftover: !r.feasible,
            });
        }
        let k = spec.rate_factor.max(1e-9);
        let (times, ins) = if spec.replay {
            let lookback = spec.horizon_s * k;
            // NOTE: early in a run the history is shorter than the lookback: what there is
            // repeats, so the rate stays the observed one (not diluted by the empty past).
            let span = lookback.min(spec.history_s.max(1e-3));
            let mut mine: Vec<&RecentArrival> = recent
                .iter()
                .filter(|r| r.tier == i && r.age_s <= span)
                .collect();
            mine.sort_by(|a, b| b.age_s.total_cmp(&a.age_s));
            let keep = thin(mine.len(), spec.scale);
            let mut at: Vec<(f64, f64)> = Vec::new();
            let mut copy = 0.0;
            while copy * span < lookback {
                for &j in &keep {
                    let x = copy * span + span - mine[j].age_s;
                    if x < lookback {
                        at.push((x / k, mine[j].prompt));
                    }
                }
                copy += 1.0;
            }
            at.sort_by(|a, b| a.0.total_cmp(&b.0));
            at.into_iter().unzip()
        } else {
            // Poisson at the thinned rate.
            let rate = d.rate_rps.max(0.0) * spec.scale * k;
            if rate <= 0.0 {
                continue;
            }
            let mut times = Vec::new();
            let mut t = -rng.uniform().ln() / rate;
            while t < spec.horizon_s {
                times.push(t);
                t += -rng.uniform().ln() / rate;
            }
            let ins = prompts.draw(&mut rng, times.len());
            (times, ins)
        };
        let outs = outputs.draw(&mut rng, times.len());
        for (k, &t) in times.iter().enumerate() {
            out.push(TraceRequest {
                arrival_s: t,
                input_len: tokens(ins[k]),
                output_len: tokens(outs[k]),
                tier: tier.name.clone(),
                leftover: false,
            });
        }
    }
    out.sort_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s));
    out
}

/// Indices of `n` items kept at rate `scale` (evenly spaced; all of them at scale ≥ 1).
fn thin(n: usize, scale: f64) -> Vec<usize> {
    let scale = scale.clamp(0.0, 1.0);
    let mut acc = 0.5;
    let mut out = Vec::new();
    for i in 0..n {
        acc += scale;
        if acc >= 1.0 {
            acc -= 1.0;
            out.push(i);
        }
    }
    out
}

#[cfg(test)]
#[path = "forecast_tests.rs"]
mod tests;
