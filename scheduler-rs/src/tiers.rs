//! SLO tiers: the contract each request class is served under.

use serde::{Deserialize, Serialize};

/// One SLO tier, as listed in the tiers config file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tier {
    pub name: String,
    /// Time-to-first-token target in milliseconds.
    pub ttft_ms: f64,
    /// Mean time-per-output-token target (after the first) in milliseconds.
    pub tpot_ms: f64,
    /// Relative importance in the planner's greedy weighting (default 1).
    #[serde(default = "default_weight")]
    pub weight: f64,
    /// Background tiers have no SLO that the planner reserves devices for.
    #[serde(default)]
    pub background: bool,
}

fn default_weight() -> f64 {
    1.0
}
