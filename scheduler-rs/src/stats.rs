//! Per-tier sliding-window workload statistics (architecture §4 "Stats"): arrival rate over the
//! control window, prompt and output length distributions over a (longer) profile window.
//!
//! Pure: every call takes `now` (seconds on any monotonic clock), so the router feeds it
//! wall time and the simulator feeds simulated time.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

/// Mean and a few quantiles of a length distribution (tokens). In JSON every field may be
/// omitted (0); the planner reads `mean`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LengthStats {
    pub count: u64,
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
}

impl LengthStats {
    /// Statistics of `values` (nearest-rank quantiles). All zero when empty.
    pub fn of(values: &mut [f64]) -> Self {
        if values.is_empty() {
            return Self::default();
        }
        values.sort_by(f64::total_cmp);
        let n = values.len();
        let q = |p: f64| values[((p * n as f64).ceil() as usize).clamp(1, n) - 1];
        LengthStats {
            count: n as u64,
            mean: values.iter().sum::<f64>() / n as f64,
            p50: q(0.5),
            p90: q(0.9),
            p99: q(0.99),
        }
    }

    /// A point distribution (every request has length `len`); handy for tests and traces.
    pub fn constant(len: f64) -> Self {
        LengthStats {
            count: 1,
            mean: len,
            p50: len,
            p90: len,
            p99: len,
        }
    }
}

/// What the planner needs to know about one tier's current demand.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TierDemand {
    pub tier: String,
    /// Arrivals per second over the control window.
    pub rate_rps: f64,
    pub prompt: LengthStats,
    pub output: LengthStats,
}

/// Request shape (mean prompt, mean output tokens) assumed where none was observed yet; the
/// default of `PlannerConfig::prior_lengths` and of the window stats' output tail.
pub const DEFAULT_PRIOR_LENGTHS: (f64, f64) = (1024.0, 256.0);

/// Window lengths.
#[derive(Debug, Clone, Copy)]
pub struct StatsConfig {
    /// Arrival-rate window (the control window), seconds.
    pub rate_window_s: f64,
    /// Length-distribution window, seconds (longer: lengths are noisier than rates).
    pub length_window_s: f64,
    /// Expected output tokens beyond the longest sample while requests are still running
    /// (the planner's prior output length).
    pub prior_output_tokens: f64,
}

impl Default for StatsConfig {
    fn default() -> Self {
        StatsConfig {
            rate_window_s: 1.0,
            length_window_s: 30.0,
            prior_output_tokens: DEFAULT_PRIOR_LENGTHS.1,
        }
    }
}

#[derive(Debug, Default)]
struct TierWindow {
    arrivals: VecDeque<f64>,
    /// (time, prompt tokens) of arrivals.
    prompts: VecDeque<(f64, f64)>,
    /// (time, output tokens) of completions.
    outputs: VecDeque<(f64, f64)>,
    /// Last non-empty length stats: kept when a window empties so a quiet tier's next burst
    /// is planned with its last known shape rather than zero lengths.
    last_prompt: LengthStats,
    last_output: LengthStats,
}

/// Kaplan-Meier mean of lengths of which `done` are final and `running` only lower bounds
/// (right-censored), with `tail` expected tokens beyond the longest sample for the mass that
/// is still running there (memoryless tail). With nothing running it is the plain mean.
pub fn censored_mean(done: &[f64], running: &[f64], tail: f64) -> f64 {
    censored_stats(done, running, tail).mean
}

/// Kaplan-Meier statistics of lengths of which `done` are final and `running` only lower
/// bounds: the mean as [`censored_mean`], and quantiles from the same survival curve (past
/// the longest sample, the memoryless tail of mean `tail`). `count` counts both.
///
/// NOTE: counting a running request as its length so far biases every quantile low; under
/// overload most running requests are still waiting (0 tokens), and the median came out 0
/// while the mean was right.
pub fn censored_stats(done: &[f64], running: &[f64], tail: f64) -> LengthStats {
    let mut samples: Vec<(f64, bool)> = done.iter().map(|&x| (x, true)).collect();
    samples.extend(running.iter().map(|&x| (x, false)));
    if samples.is_empty() {
        return LengthStats::default();
    }
    // NOTE: at equal lengths, completions come first: a request running at x may go beyond.
    samples.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.cmp(&a.1)));
    let (mut survival, mut mean, mut prev) = (1.0, 0.0, 0.0);
    let mut at_risk = samples.len() as f64;
    let mut quantiles = [None; 3];
    for &(x, finished) in &samples {
        mean += survival * (x - prev);
        prev = x;
        if finished {
            survival *= 1.0 - 1.0 / at_risk;
            for (q, p) in quantiles.iter_mut().zip([0.5, 0.9, 0.99]) {
                if q.is_none() && survival <= 1.0 - p + 1e-12 {
                    *q = Some(x);
                }
            }
        }
        at_risk -= 1.0;
    }
    let beyond = |p: f64| prev + tail * (survival / (1.0 - p)).ln().max(0.0);
    LengthStats {
        count: samples.len() as u64,
        mean: mean + survival * tail,
        p50: quantiles[0].unwrap_or_else(|| beyond(0.5)),
        p90: quantiles[1].unwrap_or_else(|| beyond(0.9)),
        p99: quantiles[2].unwrap_or_else(|| beyond(0.99)),
    }
}

/// Sliding-window statistics for all tiers.
#[derive(Debug, Default)]
pub struct WindowStats {
    cfg: StatsConfig,
    tiers: BTreeMap<String, TierWindow>,
}

impl WindowStats {
    pub fn new(cfg: StatsConfig) -> Self {
        WindowStats {
            cfg,
            tiers: BTreeMap::new(),
        }
    }

    /// A request of `tier` with `prompt_tokens` arrived at `now`.
    pub fn on_arrival(&mut self, now: f64, tier: &str, prompt_tokens: u32) {
        let w = self.window(tier);
        w.arrivals.push_back(now);
        w.prompts.push_back((now, f64::from(prompt_tokens)));
    }

    /// (tier, seconds ago, prompt tokens) of the arrivals within `lookback_s` of `now`, as
    /// far as the length window still holds them (`length_window_s`), oldest first per tier.
    pub fn recent_arrivals(&self, now: f64, lookback_s: f64) -> Vec<(&str, f64, f64)> {
        let since = now - lookback_s.min(self.cfg.length_window_s);
        self.tiers
            .iter()
            .flat_map(|(name, w)| {
                w.prompts
                    .iter()
                    .filter(move |&&(t, _)| t > since && t <= now)
                    .map(move |&(t, p)| (name.as_str(), now - t, p))
            })
            .collect()
    }

    /// A request of `tier` finished at `now` having generated `output_tokens`.
    pub fn on_completion(&mut self, now: f64, tier: &str, output_tokens: u32) {
        self.window(tier)
            .outputs
            .push_back((now, f64::from(output_tokens)));
    }

    /// Current demand of every tier seen so far, ordered by tier name. Drops expired samples.
    /// `running` lists (tier, tokens generated so far) of the requests still in flight.
    ///
    /// Output lengths are censored: completions in a window are biased towards short requests
    /// (long ones are still running), most of all in a burst's first windows and under
    /// overload. The output mean is therefore [`censored_mean`] over completions and running
    /// requests, in windows with a completion (before the first its output stays unknown:
    /// the planner's prior; a window without any keeps the last shape), and so are the
    /// quantiles ([`censored_stats`]).
    /// NOTE: `now` must not go backwards between calls (samples older than the window are
    /// discarded for good).
    pub fn snapshot(&mut self, now: f64, running: &[(&str, f64)]) -> Vec<TierDemand> {
        let cfg = self.cfg;
        self.tiers
            .iter_mut()
            .map(|(name, w)| {
                let rate_cut = now - cfg.rate_window_s;
                let len_cut = now - cfg.length_window_s;
                while w.arrivals.front().is_some_and(|&t| t <= rate_cut) {
                    w.arrivals.pop_front();
                }
                while w.prompts.front().is_some_and(|&(t, _)| t <= len_cut) {
                    w.prompts.pop_front();
                }
                while w.outputs.front().is_some_and(|&(t, _)| t <= len_cut) {
                    w.outputs.pop_front();
                }
                let mut p: Vec<f64> = w.prompts.iter().map(|x| x.1).collect();
                let o: Vec<f64> = w.outputs.iter().map(|x| x.1).collect();
                if !p.is_empty() {
                    w.last_prompt = LengthStats::of(&mut p);
                }
                let mine: Vec<f64> = running
                    .iter()
                    .filter(|(t, _)| t == name)
                    .map(|&(_, generated)| generated)
                    .collect();
                // NOTE: a window without completions keeps the last shape: running requests
                // alone carry no event, only lower bounds.
                if !o.is_empty() {
                    w.last_output = censored_stats(&o, &mine, cfg.prior_output_tokens);
                }
                TierDemand {
                    tier: name.clone(),
                    rate_rps: w.arrivals.len() as f64 / cfg.rate_window_s,
                    prompt: w.last_prompt,
                    output: w.last_output,
                }
            })
            .collect()
    }

    fn window(&mut self, tier: &str) -> &mut TierWindow {
        if !self.tiers.contains_key(tier) {
            self.tiers.insert(tier.to_string(), TierWindow::default());
        }
        self.tiers.get_mut(tier).expect("inserted above")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_nearest_rank() {
        let mut v: Vec<f64> = (1..=100).map(f64::from).collect();
        let s = LengthStats::of(&mut v);
        assert_eq!(
            (s.count, s.mean, s.p50, s.p90, s.p99),
            (100, 50.5, 50.0, 90.0, 99.0)
        );
        assert_eq!(LengthStats::of(&mut []), LengthStats::default());
    }

    #[test]
    fn rate_and_lengths_slide_with_time() {
        let mut st = WindowStats::new(StatsConfig {
            rate_window_s: 1.0,
            length_window_s: 2.0,
            ..StatsConfig::default()
        });
        for (t, len) in [(0.1, 10), (0.5, 20), (1.2, 30), (1.4, 40)] {
            st.on_arrival(t, "a", len);
        }
        st.on_completion(1.0, "a", 7);
        st.on_arrival(1.0, "b", 5);
        let snap = st.snapshot(1.5, &[]);
        assert_eq!(snap.len(), 2);
        // Window (0.5, 1.5]: arrivals at 1.2 and 1.4 (0.5 sits on the cut and is excluded).
        assert_eq!(snap[0].tier, "a");
        assert_eq!(snap[0].rate_rps, 2.0);
        assert_eq!(snap[0].prompt.mean, 25.0);
        assert_eq!(snap[0].output.mean, 7.0);
        assert_eq!(snap[1].rate_rps, 1.0);
        // Everything expires: the rate drops to 0 but the last length shape is kept.
        let later = st.snapshot(10.0, &[]);
        assert_eq!(later[0].rate_rps, 0.0);
        assert_eq!(later[0].prompt.mean, 25.0);
        assert_eq!(later[0].output.p99, 7.0);
    }

    #[test]
    fn recent_arrivals_list_tier_age_and_prompt_within_the_lookback() {
        let mut st = WindowStats::new(StatsConfig {
            length_window_s: 2.0,
            ..StatsConfig::default()
        });
        for (t, len) in [(0.1, 10), (1.2, 30), (1.4, 40)] {
            st.on_arrival(t, "a", len);
        }
        st.on_arrival(1.0, "b", 5);
        let r = st.recent_arrivals(1.5, 0.4);
        assert_eq!(r.len(), 2);
        assert!(r.iter().all(|x| x.0 == "a"));
        assert!((r[0].1 - 0.3).abs() < 1e-9 && r[0].2 == 30.0);
        assert!((r[1].1 - 0.1).abs() < 1e-9 && r[1].2 == 40.0);
        // The lookback is capped by the length window (2 s): 0.1 is older than that.
        assert_eq!(st.recent_arrivals(2.5, 60.0).len(), 3);
    }

    #[test]
    fn running_requests_count_as_censored_output_samples() {
        let mut st = WindowStats::new(StatsConfig::default());
        st.on_arrival(0.0, "a", 10);
        // No completion yet: running requests say nothing (the planner's prior applies).
        let first = st.snapshot(0.5, &[("a", 3.0)]);
        assert_eq!((first[0].output.count, first[0].output.mean), (0, 0.0));
        st.on_completion(0.8, "a", 8);
        st.on_completion(0.9, "a", 12);
        let snap = st.snapshot(1.0, &[("a", 40.0), ("a", 2.0), ("b", 500.0)]);
        assert_eq!(snap[0].output.count, 4);
        assert_eq!(
            snap[0].output.mean,
            censored_mean(&[8.0, 12.0], &[40.0, 2.0], 256.0)
        );
        // Quantiles from the same survival curve: 1 up to 8, 2/3 up to 12, 1/3 from 12 on
        // (the run at 40 leaves it there); p90 and p99 lie in the memoryless tail past 40.
        assert_eq!(snap[0].output.p50, 12.0);
        let tail = |p: f64| 40.0 + 256.0 * ((1.0 / 3.0) / (1.0 - p)).ln();
        assert!((snap[0].output.p90 - tail(0.9)).abs() < 1e-9);
        assert!((snap[0].output.p99 - tail(0.99)).abs() < 1e-9);
    }

    #[test]
    fn waiting_requests_do_not_drag_the_output_quantiles_to_zero() {
        // Under overload most requests in flight are still waiting (0 tokens): lower bounds
        // that say nothing. Counted as lengths they made the median 0.
        let waiting = vec![0.0; 50];
        let s = censored_stats(&[100.0, 200.0, 300.0], &waiting, 256.0);
        assert_eq!((s.count, s.p50, s.p90, s.p99), (53, 200.0, 300.0, 300.0));
        assert!((s.mean - 200.0).abs() < 1e-9);
    }

    #[test]
    fn censored_mean_is_kaplan_meier_with_a_tail() {
        // Nothing running: the plain mean.
        assert_eq!(censored_mean(&[8.0, 12.0], &[], 256.0), 10.0);
        // Sorted: 2 (running), 8 (done), 12 (done), 40 (running). S = 1 up to 8 (the run at 2
        // only leaves the risk set), then 2/3 up to 12, then 1/3 up to 40 where the last one
        // is still running: 8 + 4·2/3 + 28·1/3 + 1/3·256 = 105.33.
        let m = censored_mean(&[8.0, 12.0], &[40.0, 2.0], 256.0);
        assert!(
            (m - (8.0 + 4.0 * 2.0 / 3.0 + 28.0 / 3.0 + 256.0 / 3.0)).abs() < 1e-9,
            "{m}"
        );
        // Running requests at most as long as the completed ones barely move it.
        let short = censored_mean(&[100.0; 9], &[1.0], 256.0);
        assert!((short - 100.0).abs() < 1e-9, "{short}");
    }
}
