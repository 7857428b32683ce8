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
    /// Requests of this tier the router holds at once (queued or running); a new one beyond
    /// it is refused with 429 and `Retry-After` instead of queueing for minutes. None:
    /// unbounded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_inflight: Option<u32>,
    /// Largest `max_tokens` a request of this tier may ask for (400 beyond: a request that
    /// holds a slot for minutes blocks others). None: up to the context window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// SLO-aware admission: a request the plan has no SLO bandwidth left for (it would be
    /// served best effort, late) is refused at once with 429 `slo_unattainable` and
    /// `Retry-After` instead. Default false: it is served on leftover capacity.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reject_unattainable: bool,
    /// Its requests may preempt running requests of a lower class or `priority` on their
    /// worker to start at once (FastSwitch); false: they wait for room. Default true.
    #[serde(default = "yes", skip_serializing_if = "Clone::clone")]
    pub preempt: bool,
    /// Its requests run on a TP group of this size bound for them on their worker, for
    /// their lifetime (Flying Serving's priority binding: a premium tier at TP k while the
    /// plan keeps DP replicas). None: on the group they are dispatched to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bind_tp: Option<u32>,
}

fn yes() -> bool {
    true
}

fn default_weight() -> f64 {
    1.0
}

impl Tier {
    /// A tier of this name with a 1 s TTFT and 100 ms TPOT target and the defaults otherwise
    /// (tests: tier lists that ids and plan names resolve against).
    #[cfg(test)]
    pub fn with_name(name: &str) -> Self {
        serde_json::from_value(serde_json::json!({"name": name, "ttft_ms": 1000, "tpot_ms": 100}))
            .expect("a valid tier")
    }
}
