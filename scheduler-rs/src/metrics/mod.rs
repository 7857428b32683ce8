//! Request metrics: lock-free per-tier histograms and counters, rendered as Prometheus text,
//! and their vLLM-compatible twins (`vllm.rs`). Plan and per-group gauges are rendered from a
//! snapshot by `api::misc`.

pub mod binding;
pub mod engine;
mod histogram;
mod sglang_text;
mod text;
pub mod vllm;
mod vllm_text;

use std::sync::atomic::{AtomicU64, Ordering};

pub use histogram::Histogram;
use vllm::{FinishedReason, VllmMetrics};

use crate::ids::TierId;
use crate::tiers::Tier;

/// Histogram bucket upper bounds in seconds of the `nitsum_*` TTFT, TPOT and E2E histograms.
pub const BUCKETS: [f64; 16] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// Counters and histograms of one tier.
#[derive(Debug)]
pub struct TierMetrics {
    pub ttft: Histogram,
    pub tpot: Histogram,
    pub e2e: Histogram,
    /// Requests accepted (dispatched to a worker), by class.
    pub feasible: AtomicU64,
    pub best_effort: AtomicU64,
    pub background: AtomicU64,
    /// Requests that finished with a completion.
    pub finished: AtomicU64,
    /// Finished requests that met both TTFT and TPOT: the goodput counter.
    pub slo_met: AtomicU64,
    /// Requests that ended with an error (worker failure, no capacity after retries).
    pub errors: AtomicU64,
    /// Requests cancelled by the client.
    pub cancelled: AtomicU64,
    /// Requests ended by the router's per-request deadline (`request_timeout_ms`).
    pub timed_out: AtomicU64,
    /// Requests refused with 503 because no worker could take them.
    pub rejected: AtomicU64,
    /// Re-dispatches after a worker died.
    pub retries: AtomicU64,
    /// Of those, re-dispatches of a request that had streamed tokens (resumed from them).
    pub resumed: AtomicU64,
    /// Completion tokens produced.
    pub tokens: AtomicU64,
}

impl Default for TierMetrics {
    fn default() -> Self {
        TierMetrics {
            ttft: Histogram::new(&BUCKETS),
            tpot: Histogram::new(&BUCKETS),
            e2e: Histogram::new(&BUCKETS),
            feasible: AtomicU64::new(0),
            best_effort: AtomicU64::new(0),
            background: AtomicU64::new(0),
            finished: AtomicU64::new(0),
            slo_met: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            timed_out: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            resumed: AtomicU64::new(0),
            tokens: AtomicU64::new(0),
        }
    }
}

impl TierMetrics {
    /// Fraction of completed requests that met their SLO; None before the first completion.
    /// NOTE: not 1: a tier that finished nothing (all queued, all failed) attained nothing
    /// either, and dashboards must not show it as perfect.
    pub fn attainment(&self) -> Option<f64> {
        let f = self.finished.load(Ordering::Relaxed);
        let met = self.slo_met.load(Ordering::Relaxed);
        (f > 0).then(|| met as f64 / f as f64)
    }
}

/// All request metrics, indexed like the config's tiers.
#[derive(Debug)]
pub struct Metrics {
    /// (tier name, metrics) in the config's tier order: a router `TierId` indexes it.
    pub tiers: Vec<(String, TierMetrics)>,
    /// Control rounds by result (`nitsum_plan_changes_total{result}`).
    pub plan_applied: AtomicU64,
    pub plan_refused: AtomicU64,
    pub plan_timeout: AtomicU64,
    /// Worker-plane refusals (docs/security.md).
    pub plane: crate::worker_auth::PlaneMetrics,
    /// The same requests in vLLM's metric names (`vllm:*`, labelled `model_name`).
    pub vllm: VllmMetrics,
}

/// How one finished request went, for the histograms.
#[derive(Debug, Clone, Copy)]
pub struct Completion {
    pub ttft_s: Option<f64>,
    pub e2e_s: f64,
    /// Output tokens.
    pub tokens: u64,
    pub prompt_tokens: u64,
    /// Time its worker held it before its first scheduled step, when the worker said.
    pub queue_s: Option<f64>,
}

impl Completion {
    /// Mean time per output token after the first (two tokens or more).
    pub fn tpot_s(&self) -> Option<f64> {
        let ttft = self.ttft_s?;
        (self.tokens > 1).then(|| (self.e2e_s - ttft) / (self.tokens - 1) as f64)
    }

    /// Whether the completion met `tier`'s TTFT and TPOT (one with no token meets both).
    pub fn meets(&self, tier: &Tier) -> bool {
        let ttft_ok = self.ttft_s.is_none_or(|t| t * 1e3 <= tier.ttft_ms);
        ttft_ok && self.tpot_s().is_none_or(|t| t * 1e3 <= tier.tpot_ms)
    }
}

impl Metrics {
    /// Metrics of `tiers`, the vLLM-compatible ones labelled with `model_name`.
    pub fn new(tiers: &[Tier], model_name: &str) -> Self {
        Metrics {
            tiers: tiers
                .iter()
                .map(|t| (t.name.clone(), TierMetrics::default()))
                .collect(),
            plan_applied: AtomicU64::new(0),
            plan_refused: AtomicU64::new(0),
            plan_timeout: AtomicU64::new(0),
            plane: Default::default(),
            vllm: VllmMetrics::new(model_name),
        }
    }

    /// The metrics of tier `id`.
    pub fn tier(&self, id: TierId) -> &TierMetrics {
        &self.tiers[id.index()].1
    }

    /// Record a completed request (ended for `reason`: stop or length) and whether it met its
    /// tier's SLO.
    pub fn record_completion(
        &self,
        id: TierId,
        tier: &Tier,
        c: Completion,
        reason: FinishedReason,
    ) {
        self.vllm.on_completion(&c, reason);
        let m = self.tier(id);
        m.finished.fetch_add(1, Ordering::Relaxed);
        m.tokens.fetch_add(c.tokens, Ordering::Relaxed);
        m.e2e.observe(c.e2e_s);
        if let Some(ttft) = c.ttft_s {
            m.ttft.observe(ttft);
            if let Some(tpot) = c.tpot_s() {
                m.tpot.observe(tpot);
            }
        }
        // NOTE: background tiers have no SLO; their completions always count as met.
        if c.meets(tier) || tier.background {
            m.slo_met.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests;
