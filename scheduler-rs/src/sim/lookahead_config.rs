//! The knobs of the strategy choice (forecast and shadow, `LookaheadConfig`) and the engine
//! constants a prediction simulates with (`EngineKnobs`); the choice itself is
//! [`super::lookahead`] and [`super::shadow`].

use serde::{Deserialize, Serialize};

use super::SimConfig;

/// Where the forecast's arrivals come from (see [`forecast`](super::forecast::forecast)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ForecastKind {
    /// The recent arrivals replayed (Poisson where none are known, e.g. a bare benchmark).
    Replay,
    /// Poisson at the window's rate, log-normal lengths.
    Poisson,
}

/// How a selection round rates the strategies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChoiceKind {
    /// What each strategy's shadow run delivered on the real arrivals (`shadow/`).
    Shadow,
    /// Each strategy simulated from the current state on a forecast (`lookahead.rs`).
    Forecast,
}

/// Knobs of the choice.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LookaheadConfig {
    /// Whether the router's control loop chooses strategies (false: the greedy alone).
    pub enabled: bool,
    /// Seconds of forecast arrivals each candidate is simulated on.
    pub horizon_s: f64,
    /// Devices of the simulated copy of the pool (at least the largest TP level).
    pub eval_devices: u32,
    /// Keep the current strategy unless another predicts this much more goodput (relative).
    pub switch_margin: f64,
    /// Run a selection round every this many control windows.
    pub every_windows: u32,
    /// Weight of each delivered/predicted check in a strategy's bias (0: no correction).
    pub bias_rate: f64,
    /// Share of a moved device's predicted goodput charged to a switch (see `choose`).
    pub move_penalty: f64,
    /// Rate multiplier of the surge forecast each candidate is also predicted on.
    pub surge: f64,
    /// Weight of the newest prediction in each candidate's running average (1: no memory).
    /// Predictions from one window's demand are noisy under bursts; acting on each one
    /// swings the layout (and migrates KV) every window.
    pub smoothing: f64,
    /// Where the forecast's arrivals come from.
    pub forecast: ForecastKind,
    /// Rivals of the strategy in force predicted per round (0: every candidate, every
    /// round): the best-ranked one, then the least recently predicted (see `Chooser::round`).
    pub rivals_per_round: u32,
    /// How strategies are rated: shadow runs (default) or the forecast lookahead.
    pub choice: ChoiceKind,
    /// Shadow choice: seconds over which what a shadow delivered is remembered (the weight
    /// of a request decays as `exp(-age / memory_s)`).
    pub memory_s: f64,
    /// Shadow choice: seconds after its arrival a request is judged (at least 1.5 × the
    /// longest TTFT): met, missed, or on track while it decodes.
    pub settle_s: f64,
    /// Shadow choice: switch only to a rival whose lead is this many standard deviations of
    /// a sign test on the requests where the two differ...
    pub confidence: f64,
    /// ...and that met this much more (relative) than the strategy in force.
    pub shadow_margin: f64,
}

impl LookaheadConfig {
    /// Seconds of past arrivals the replay forecast needs (surge included).
    pub fn lookback_s(&self) -> f64 {
        2.0 * self.horizon_s * self.surge.max(1.0)
    }
}

impl Default for LookaheadConfig {
    fn default() -> Self {
        LookaheadConfig {
            enabled: true,
            horizon_s: 4.0,
            eval_devices: 16,
            switch_margin: 0.1,
            every_windows: 1,
            smoothing: 0.5,
            surge: 1.5,
            move_penalty: 0.15,
            bias_rate: 0.0,
            forecast: ForecastKind::Replay,
            rivals_per_round: 2,
            choice: ChoiceKind::Shadow,
            memory_s: 30.0,
            settle_s: 0.5,
            confidence: 2.0,
            shadow_margin: 0.02,
        }
    }
}

/// The engine constants a prediction simulates with (the `SimConfig` fields of that name).
#[derive(Debug, Clone, Copy)]
pub struct EngineKnobs {
    /// Control window, seconds (shadow runs re-plan at this period).
    pub window_s: f64,
    pub switch_ms: f64,
    pub kv_bytes_per_token: f64,
    pub kv_bandwidth_gbps: f64,
    pub chunk_tokens: u32,
    pub prefill_budget_tokens: u32,
    /// How bound tiers are served (`SimConfig::binding`).
    pub binding: super::BindPolicy,
}

impl Default for EngineKnobs {
    /// The simulator's defaults (Llama-3-8B fp16 KV, 100 GB/s, 512-token chunks).
    fn default() -> Self {
        use super::defaults as d;
        EngineKnobs {
            window_s: d::window_s(),
            switch_ms: d::switch_ms(),
            kv_bytes_per_token: d::kv_bytes_per_token(),
            kv_bandwidth_gbps: d::kv_bandwidth_gbps(),
            chunk_tokens: d::chunk_tokens(),
            prefill_budget_tokens: d::prefill_budget_tokens(),
            binding: super::BindPolicy::default(),
        }
    }
}

impl EngineKnobs {
    pub fn of(cfg: &SimConfig) -> Self {
        EngineKnobs {
            window_s: cfg.window_s,
            switch_ms: cfg.switch_ms,
            kv_bytes_per_token: cfg.kv_bytes_per_token,
            kv_bandwidth_gbps: cfg.kv_bandwidth_gbps,
            chunk_tokens: cfg.chunk_tokens,
            prefill_budget_tokens: cfg.prefill_budget_tokens,
            binding: cfg.binding,
        }
    }
}
