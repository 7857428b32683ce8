//! The per-tier sliding windows: arrivals, prompt and output lengths, and the snapshot the
//! planner reads.

use std::collections::{BTreeMap, VecDeque};

use super::demand::{TierDemand, DEFAULT_PRIOR_LENGTHS};
use super::lengths::{censored_stats, LengthStats};

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

    /// An arrival at `t` reported late (another router's, forwarded to the planning leader):
    /// kept in time order among the others.
    pub fn insert_arrival(&mut self, t: f64, tier: &str, prompt_tokens: u32) {
        let w = self.window(tier);
        insert_sorted(&mut w.arrivals, t, |&x| x);
        insert_sorted(&mut w.prompts, (t, f64::from(prompt_tokens)), |x| x.0);
    }

    /// A completion at `t` reported late (see [`Self::insert_arrival`]).
    pub fn insert_completion(&mut self, t: f64, tier: &str, output_tokens: u32) {
        let w = self.window(tier);
        insert_sorted(&mut w.outputs, (t, f64::from(output_tokens)), |x| x.0);
    }

    /// (tier, seconds ago, output tokens) of the completions within `lookback_s` of `now`
    /// the length window still holds.
    pub fn recent_completions(&self, now: f64, lookback_s: f64) -> Vec<(&str, f64, f64)> {
        self.recent(now, lookback_s, |w| &w.outputs)
    }

    /// The length window, seconds.
    pub fn length_window_s(&self) -> f64 {
        self.cfg.length_window_s
    }

    /// (tier, seconds ago, prompt tokens) of the arrivals within `lookback_s` of `now`, as
    /// far as the length window still holds them (`length_window_s`), oldest first per tier.
    pub fn recent_arrivals(&self, now: f64, lookback_s: f64) -> Vec<(&str, f64, f64)> {
        self.recent(now, lookback_s, |w| &w.prompts)
    }

    /// (tier, seconds ago, value) of the (time, value) samples `of` each tier's window within
    /// `lookback_s` of `now` (at most the length window), oldest first per tier.
    fn recent(
        &self,
        now: f64,
        lookback_s: f64,
        of: impl Fn(&TierWindow) -> &VecDeque<(f64, f64)>,
    ) -> Vec<(&str, f64, f64)> {
        let since = now - lookback_s.min(self.cfg.length_window_s);
        self.tiers
            .iter()
            .flat_map(|(name, w)| {
                of(w)
                    .iter()
                    .filter(move |&&(t, _)| t > since && t <= now)
                    .map(move |&(t, v)| (name.as_str(), now - t, v))
            })
            .collect()
    }

    /// A request of `tier` finished at `now` having generated `output_tokens`.
    pub fn on_completion(&mut self, now: f64, tier: &str, output_tokens: u32) {
        self.window(tier)
            .outputs
            .push_back((now, f64::from(output_tokens)));
    }

    /// Drop the samples older than the windows at `now` (what [`Self::snapshot`] does first;
    /// for a router that records but does not plan: a follower of several routers).
    pub fn prune(&mut self, now: f64) {
        let (rate_cut, len_cut) = (now - self.cfg.rate_window_s, now - self.cfg.length_window_s);
        for w in self.tiers.values_mut() {
            while w.arrivals.front().is_some_and(|&t| t <= rate_cut) {
                w.arrivals.pop_front();
            }
            while w.prompts.front().is_some_and(|&(t, _)| t <= len_cut) {
                w.prompts.pop_front();
            }
            while w.outputs.front().is_some_and(|&(t, _)| t <= len_cut) {
                w.outputs.pop_front();
            }
        }
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
        self.prune(now);
        self.tiers
            .iter_mut()
            .map(|(name, w)| {
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

/// Insert `x` after every element whose time is at most its own (the deque stays sorted).
pub fn insert_sorted<T>(q: &mut VecDeque<T>, x: T, time: impl Fn(&T) -> f64) {
    let t = time(&x);
    let at = q.partition_point(|y| time(y) <= t);
    q.insert(at, x);
}
