//! The planner's knobs ([`PlannerConfig`]).

use serde::{Deserialize, Serialize};

/// Planner knobs (JSON: any subset of the fields; the rest keep their defaults).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct PlannerConfig {
    /// TP levels allowed (by the model and the operator); `None`: all profiled levels.
    /// A single level is the "no dynamic TP" ablation.
    pub tp_levels: Option<Vec<u32>>,
    /// Fraction of TTFT a prefill batch may take (the rest covers waiting for the batch ahead).
    pub prefill_slack: f64,
    /// Largest number of prompts batched into one prefill forward.
    pub max_prefill_batch: u32,
    /// Whether prefill/decode disaggregated bundles are candidates.
    pub disaggregation: bool,
    /// Prefill token budget per iteration of a mixed group's local scheduler.
    pub chunk_tokens: f64,
    /// Plan against `margin × SLO` (TTFT and TPOT): headroom for queueing jitter, KV
    /// handoffs and length variance the mean-based estimates do not see.
    pub slo_margin: f64,
    /// Plan SLO groups for `demand / target_utilization`: groups sized at exactly 100% of
    /// their SLO capacity queue (and miss TTFT) on every burst. 1.0 plans the bare demand.
    pub target_utilization: f64,
    /// Hysteresis: keep the previous plan while every tier's rate is at most this fraction of
    /// its capacity under it (re-estimated with the current lengths). 0 re-plans every window.
    pub keep_utilization: f64,
    /// Hysteresis under load: when the previous plan no longer serves the demand, switch only
    /// to a plan that serves more than `1 + switch_gain` times as much of it.
    pub switch_gain: f64,
    /// Request shape (mean prompt, mean output tokens) assumed where none was observed yet: a
    /// tier's output lengths before its first completion, and the TP level of the best-effort
    /// groups that serve the first window.
    pub prior_lengths: (f64, f64),
}

impl Default for PlannerConfig {
    fn default() -> Self {
        PlannerConfig {
            tp_levels: None,
            prefill_slack: 0.5,
            max_prefill_batch: 64,
            disaggregation: true,
            chunk_tokens: 512.0,
            slo_margin: 1.0,
            target_utilization: 0.5,
            keep_utilization: 0.9,
            switch_gain: 0.1,
            prior_lengths: crate::stats::DEFAULT_PRIOR_LENGTHS,
        }
    }
}

impl PlannerConfig {
    /// These settings for a pool whose workers registered `tp_levels` (those whose aligned
    /// groups stay inside one host worker process) and whose prefill groups can reach every
    /// decode group (`kv_linked`: one process, or one KV transport between the processes):
    /// the operator's allowed levels narrowed to the pool's, and no disaggregation unless
    /// linked.
    ///
    /// NOTE: without a link a prefill group in one process and its decode group in another
    /// would decode the request itself, off the plan. With one the planner may place a P/D
    /// bundle across processes whenever that serves best; TP groups never cross them, as
    /// they only get the pool's levels on aligned blocks.
    pub fn for_pool(&self, tp_levels: &[u32], kv_linked: bool) -> PlannerConfig {
        let mut cfg = self.clone();
        cfg.tp_levels = Some(match cfg.tp_levels.take() {
            Some(allowed) => tp_levels
                .iter()
                .copied()
                .filter(|t| allowed.contains(t))
                .collect(),
            None => tp_levels.to_vec(),
        });
        cfg.disaggregation &= kv_linked;
        cfg
    }
}
