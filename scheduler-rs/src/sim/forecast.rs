//! The workload the lookahead predicts on: the next `horizon_s` of arrivals, plus the
//! requests already in flight, thinned to a smaller pool. Arrivals either replay the recent
//! ones (their times and prompts: bursts and the real length mix included) or are drawn
//! Poisson at the window's rate with log-normal lengths.
//!
//! Pure and deterministic (a fixed-seed generator): equal inputs give equal forecasts, so the
//! router and the simulator make the same choice from the same state.

use crate::stats::{LengthStats, TierDemand};
use crate::tiers::Tier;

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

/// splitmix64: a tiny deterministic generator (no dependency, stable across platforms).
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new(seed: u64) -> Self {
        Rng(seed)
    }

    fn uniform(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        ((z >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    fn normal(&mut self) -> f64 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
}

/// Draws lengths with the observed median and p90 (log-normal) and the observed mean: the
/// draws are rescaled to the mean, which is what sets the load.
pub(super) struct Lengths {
    median: f64,
    sigma: f64,
    mean: f64,
}

impl Lengths {
    /// Every draw `prior` (nothing observed).
    pub(super) fn prior(prior: f64) -> Self {
        Lengths {
            median: prior,
            sigma: 0.0,
            mean: prior,
        }
    }

    /// One draw, in tokens; the log-normal is scaled so that its mean is the observed one.
    pub(super) fn one(&self, rng: &mut Rng) -> u32 {
        let log_normal_mean = self.median * (self.sigma * self.sigma / 2.0).exp();
        let x = self.median * (self.sigma * rng.normal()).exp();
        tokens(x * self.mean / log_normal_mean.max(1e-9))
    }

    pub(super) fn new(s: &LengthStats, prior: f64) -> Self {
        let mean = if s.mean > 0.0 { s.mean } else { prior };
        let median = if s.p50 > 0.0 { s.p50 } else { mean };
        let sigma = if s.p90 > median {
            ((s.p90 / median).ln() / 1.2816).min(2.5)
        } else {
            0.0
        };
        Lengths {
            median,
            sigma,
            mean,
        }
    }

    fn draw(&self, rng: &mut Rng, n: usize) -> Vec<f64> {
        let mut v: Vec<f64> = (0..n)
            .map(|_| self.median * (self.sigma * rng.normal()).exp())
            .collect();
        let m = v.iter().sum::<f64>() / n.max(1) as f64;
        if m > 0.0 {
            v.iter_mut().for_each(|x| *x *= self.mean / m);
        }
        v
    }
}

fn tokens(x: f64) -> u32 {
    x.round().clamp(1.0, 1e6) as u32
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
    let mut rng = Rng(spec.seed);
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
mod tests {
    use super::*;

    fn tier(name: &str) -> Tier {
        serde_json::from_str(&format!(
            r#"{{"name": "{name}", "ttft_ms": 100, "tpot_ms": 20}}"#
        ))
        .unwrap()
    }

    fn demand(name: &str, rate: f64, prompt: f64, output: f64) -> TierDemand {
        let stats = |m: f64| LengthStats {
            count: 100,
            mean: m,
            p50: m * 0.6,
            p90: m * 2.0,
            p99: m * 5.0,
        };
        TierDemand {
            tier: name.into(),
            rate_rps: rate,
            prompt: stats(prompt),
            output: stats(output),
        }
    }

    #[test]
    fn forecast_keeps_rate_mean_lengths_and_thins_the_pool() {
        let tiers = [tier("a"), tier("b")];
        let d = [
            demand("a", 400.0, 1000.0, 200.0),
            demand("b", 100.0, 50.0, 20.0),
        ];
        let inflight: Vec<InFlight> = (0..80)
            .map(|k| InFlight {
                tier: k % 2,
                generated: if k < 40 { 0.0 } else { 30.0 },
                age_s: 0.0,
                feasible: k < 40, // the decoding ones were demoted
            })
            .collect();
        let spec = ForecastSpec {
            horizon_s: 10.0,
            rate_factor: 1.0,
            replay: false,
            history_s: f64::INFINITY,
            scale: 0.25,
            prior_lengths: (1024.0, 256.0),
            seed: 1,
        };
        let f = forecast(&tiers, &d, &inflight, &[], &spec);
        assert_eq!(
            f,
            forecast(&tiers, &d, &inflight, &[], &spec),
            "deterministic"
        );
        let arrivals = |t: &str| -> Vec<&TraceRequest> {
            f.iter()
                .filter(|r| r.tier == t && r.arrival_s > 0.0)
                .collect()
        };
        // 400 rps × 0.25 × 10 s = 1000 arrivals (Poisson: within 10%), lengths at the mean.
        let a = arrivals("a");
        assert!((900..1100).contains(&a.len()), "{}", a.len());
        let mean_in = a.iter().map(|r| f64::from(r.input_len)).sum::<f64>() / a.len() as f64;
        assert!((mean_in - 1000.0).abs() < 5.0, "{mean_in}");
        assert!(a.iter().all(|r| r.arrival_s < 10.0));
        assert!((200..300).contains(&arrivals("b").len()));
        // 80 in flight, a quarter kept: 10 waiting (fresh prompts), 10 decoding (1-token
        // prompt, 200 - 30 = 170 tokens left for tier a).
        let now: Vec<_> = f.iter().filter(|r| r.arrival_s == 0.0).collect();
        assert_eq!(now.len(), 20);
        assert_eq!(now.iter().filter(|r| r.input_len == 1).count(), 10);
        assert!(now
            .iter()
            .any(|r| r.tier == "a" && r.input_len == 1 && r.output_len == 170));
        // The decoding ones held no SLO bandwidth: they come back as leftover work.
        assert!(now.iter().all(|r| r.leftover == (r.input_len == 1)));
        assert!(f.iter().filter(|r| r.arrival_s > 0.0).all(|r| !r.leftover));
    }

    #[test]
    fn replay_keeps_recent_times_and_prompts_compressed_by_the_rate_factor_and_thinned() {
        let tiers = [tier("a"), tier("b")];
        let d = [demand("a", 1.0, 100.0, 50.0), demand("b", 1.0, 100.0, 50.0)];
        // Tier a: one arrival every 0.1 s over the last 20 s, prompt = 10 × its index.
        let recent: Vec<RecentArrival> = (0..200)
            .map(|k| RecentArrival {
                tier: 0,
                age_s: 20.0 - 0.1 * f64::from(k),
                prompt: 10.0 * f64::from(k + 1),
            })
            .collect();
        let spec = ForecastSpec {
            horizon_s: 5.0,
            rate_factor: 2.0,
            replay: true,
            history_s: f64::INFINITY,
            scale: 0.5,
            prior_lengths: (1024.0, 256.0),
            seed: 1,
        };
        let f = forecast(&tiers, &d, &[], &recent, &spec);
        // The last 10 s (ages ≤ 10: 101 arrivals) compressed into 5 s, every other one kept.
        assert!(
            f.iter().all(|r| r.tier == "a"),
            "b replays nothing: none arrived"
        );
        assert_eq!(f.len(), 50);
        assert!(f.iter().all(|r| (0.0..5.0).contains(&r.arrival_s)));
        // Arrival at age a replays at (10 - a) / 2 with its own prompt (a = 20 - 0.1 k).
        for r in &f {
            let k = (f64::from(r.input_len) / 10.0).round() - 1.0;
            let at = (10.0 - (20.0 - 0.1 * k)) / 2.0;
            assert!((r.arrival_s - at).abs() < 1e-9, "{} vs {at}", r.arrival_s);
        }
        let poisson = ForecastSpec {
            replay: false,
            ..spec
        };
        assert!(
            forecast(&tiers, &d, &[], &recent, &poisson)
                .iter()
                .any(|r| r.tier == "b"),
            "without replay tier b arrives at its rate"
        );
    }

    #[test]
    fn a_replay_longer_than_the_history_repeats_it_at_the_observed_rate() {
        let tiers = [tier("a")];
        let d = [demand("a", 1.0, 100.0, 50.0)];
        // 2 s of history, one arrival every 0.25 s: 4 req/s.
        let recent: Vec<RecentArrival> = (0..8)
            .map(|k| RecentArrival {
                tier: 0,
                age_s: 2.0 - 0.25 * f64::from(k),
                prompt: f64::from(k + 1),
            })
            .collect();
        let spec = ForecastSpec {
            horizon_s: 6.0,
            rate_factor: 1.0,
            replay: true,
            history_s: 2.0,
            scale: 1.0,
            prior_lengths: (1024.0, 256.0),
            seed: 1,
        };
        let f = forecast(&tiers, &d, &[], &recent, &spec);
        // 6 s at 4 req/s, the 2 s repeated three times in order.
        assert_eq!(f.len(), 24);
        let prompts: Vec<u32> = f.iter().map(|r| r.input_len).collect();
        assert_eq!(prompts[..8], prompts[8..16]);
        assert_eq!(prompts[..8], prompts[16..]);
        assert!((f[8].arrival_s - f[0].arrival_s - 2.0).abs() < 1e-9);
        // With a long history the same arrivals are replayed once (the rest of the 6 s is
        // empty: nothing arrived before).
        let long = ForecastSpec {
            history_s: 60.0,
            ..spec
        };
        assert_eq!(forecast(&tiers, &d, &[], &recent, &long).len(), 8);
    }

    #[test]
    fn unseen_lengths_take_the_prior() {
        let tiers = [tier("a")];
        let mut d = demand("a", 10.0, 0.0, 0.0);
        d.prompt = LengthStats::default();
        d.output = LengthStats::default();
        let spec = ForecastSpec {
            horizon_s: 5.0,
            rate_factor: 1.0,
            replay: false,
            history_s: f64::INFINITY,
            scale: 1.0,
            prior_lengths: (300.0, 40.0),
            seed: 1,
        };
        let f = forecast(&tiers, &[d], &[], &[], &spec);
        assert!(!f.is_empty());
        assert!(f.iter().all(|r| r.input_len == 300 && r.output_len == 40));
    }
}
