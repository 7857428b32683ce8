//! Discrete-event cluster simulator (Nitsum §4 method): N devices driven by a profile, a
//! request trace, and one of the paper's policies. It routes with the router's own
//! [`Dispatcher`](crate::dispatch::Dispatcher) and plans with the router's own
//! [`planner`](crate::planner), so a simulated Nitsum run exercises the production decisions.
//!
//! Deterministic: no randomness anywhere (ties break by order), so equal configs give equal
//! results; `seed` is carried for trace generators upstream.

mod apply_plan;
mod bind;
mod bind_life;
mod bind_types;
pub mod choice;
pub mod chooser;
mod cluster;
mod control_tick;
mod draw;
mod event_loop;
mod event_queue;
pub mod forecast;
mod group;
pub mod lookahead;
mod lookahead_config;
mod parallel;
#[cfg(test)]
mod parity_tests;
mod policy;
mod policy_plans;
mod prompt_order;
mod report;
mod reqs;
mod routing;
pub mod shadow;
mod shadow_binding;
#[cfg(test)]
mod tests;

use serde::{Deserialize, Serialize};

use crate::profile::ProfileFile;
use crate::tiers::Tier;

pub use bind_types::{BindCounts, BindPolicy, BindRecord, BindingVerdict};
pub use policy::Policy;
pub use report::{RequestRecord, SimResult, TierResult};

/// One request of the trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceRequest {
    pub arrival_s: f64,
    pub input_len: u32,
    pub output_len: u32,
    pub tier: String,
    /// Served on leftover capacity whatever its tier, like a background request (the
    /// lookahead's re-created in-flight requests that held no SLO bandwidth).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub leftover: bool,
}

/// Everything one simulation needs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SimConfig {
    pub profile: ProfileFile,
    pub tiers: Vec<Tier>,
    pub devices: u32,
    pub policy: Policy,
    pub requests: Vec<TraceRequest>,
    /// Control window (planner period), seconds.
    #[serde(default = "defaults::window_s")]
    pub window_s: f64,
    /// Fixed cost of activating a new TP group (context switch), milliseconds.
    #[serde(default = "defaults::switch_ms")]
    pub switch_ms: f64,
    /// KV cache bytes per token per request (whole model, all layers), for migration and
    /// prefill→decode transfer times.
    #[serde(default = "defaults::kv_bytes_per_token")]
    pub kv_bytes_per_token: f64,
    /// Device-to-device bandwidth for KV moves, GB/s.
    #[serde(default = "defaults::kv_bandwidth_gbps")]
    pub kv_bandwidth_gbps: f64,
    /// Prefill token budget per iteration of a mixed group (chunked prefill).
    #[serde(default = "defaults::chunk_tokens")]
    pub chunk_tokens: u32,
    /// Prefill token budget per iteration of a prefill-only group.
    #[serde(default = "defaults::prefill_budget_tokens")]
    pub prefill_budget_tokens: u32,
    /// Requests still unfinished this long after the last arrival count as missed.
    #[serde(default = "defaults::drain_s")]
    pub drain_s: f64,
    /// Include per-request records in the result.
    #[serde(default = "defaults::records")]
    pub records: bool,
    /// Planner SLO margin for live policies (PlannerConfig::slo_margin).
    #[serde(default = "defaults::slo_margin")]
    pub slo_margin: f64,
    /// Planner target utilization for live policies (PlannerConfig::target_utilization).
    #[serde(default = "defaults::target_utilization")]
    pub target_utilization: f64,
    /// The adaptive choice's knobs (policy `nitsum`).
    #[serde(default)]
    pub lookahead: lookahead::LookaheadConfig,
    /// Tiers with `bind_tp`: the cost model decides (default), ignored, or always bound.
    #[serde(default)]
    pub binding: BindPolicy,
    #[serde(default)]
    pub seed: u64,
}

mod defaults {
    pub fn window_s() -> f64 {
        1.0
    }
    pub fn switch_ms() -> f64 {
        5.0
    }
    pub fn kv_bytes_per_token() -> f64 {
        131_072.0 // Llama-3-8B fp16: 32 layers × 8 KV heads × 128 dims × 2 (K, V) × 2 bytes
    }
    pub fn kv_bandwidth_gbps() -> f64 {
        100.0
    }
    pub fn chunk_tokens() -> u32 {
        512
    }
    pub fn prefill_budget_tokens() -> u32 {
        8192
    }
    pub fn drain_s() -> f64 {
        60.0
    }
    pub fn slo_margin() -> f64 {
        0.9
    }
    pub fn target_utilization() -> f64 {
        crate::planner::PlannerConfig::default().target_utilization
    }
    pub fn records() -> bool {
        true
    }
}

/// Run a simulation. Errors on an invalid profile, unknown tiers or TP levels.
pub fn simulate(cfg: &SimConfig) -> anyhow::Result<SimResult> {
    cluster::Cluster::new(cfg, chooser_of(cfg))?.run()
}

/// Simulate `cfg`: (arrival, tier, met) of every request, in config order (the lookahead's
/// predictions: no records, no summary).
pub fn simulate_outcomes(cfg: &SimConfig) -> anyhow::Result<Vec<(f64, crate::ids::TierId, bool)>> {
    Ok(cluster::Cluster::new(cfg, chooser_of(cfg))?.outcomes())
}

/// The chooser of `cfg`'s selection rounds: the adaptive policy's, none for the others.
fn chooser_of(cfg: &SimConfig) -> Option<Box<dyn choice::Choose>> {
    matches!(cfg.policy, Policy::Adaptive).then(|| {
        let initial = crate::planner::strategy::Strategy::Greedy;
        Box::new(chooser::Chooser::new(cfg.lookahead.clone(), initial)) as Box<dyn choice::Choose>
    })
}

/// JSON in, JSON out (the pyo3 `simulate` and the CLI use this).
pub fn simulate_json(config_json: &str) -> anyhow::Result<String> {
    let cfg: SimConfig = serde_json::from_str(config_json)
        .map_err(|e| anyhow::anyhow!("simulate: invalid config JSON: {e}"))?;
    Ok(serde_json::to_string(&simulate(&cfg)?)?)
}
