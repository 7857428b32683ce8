//! Engine-level numbers the workers report (heartbeats, `stats`), summed over the workers for
//! the `vllm:*` gauges and counters (docs/metrics.md).

use crate::ids::WorkerId;
use crate::protocols::worker::Stats;

/// Engine-level numbers summed over the workers, for the `vllm:*` gauges and counters.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineGauges {
    pub running: u64,
    pub waiting: u64,
    /// Mean device KV usage over the workers that report it, as a fraction; None: none does.
    pub kv_usage: Option<f64>,
    pub preemptions: f64,
    pub prefix_cache_queries: f64,
    pub prefix_cache_hits: f64,
    /// Requests the router refused at admission: a full tier (429), an unattainable SLO or
    /// no worker (503) (set by the caller: the tiers' `rejected`).
    pub admission_rejections: f64,
    /// KV tokens the live workers hold in all (set by the caller: from `register`).
    pub kv_tokens: u64,
}

impl EngineGauges {
    /// From the groups' (running, waiting) heartbeat sums and the workers' `stats`.
    /// NOTE: workers report `kv_cache_usage_perc` in percent; vLLM's gauge is a fraction.
    pub fn of(running: u64, waiting: u64, stats: &[(WorkerId, Stats)]) -> Self {
        let sum = |field: fn(&Stats) -> Option<u64>| -> f64 {
            stats
                .iter()
                .filter_map(|(_, s)| field(s))
                .map(|v| v as f64)
                .sum()
        };
        let kv: Vec<f64> = stats
            .iter()
            .filter_map(|(_, s)| s.kv_cache_usage_perc)
            .map(|v| v / 100.0)
            .collect();
        EngineGauges {
            running,
            waiting,
            kv_usage: (!kv.is_empty()).then(|| kv.iter().sum::<f64>() / kv.len() as f64),
            preemptions: sum(|s| s.num_preemptions),
            prefix_cache_queries: sum(|s| s.prefix_cache_queries),
            prefix_cache_hits: sum(|s| s.prefix_cache_hits),
            admission_rejections: 0.0,
            kv_tokens: 0,
        }
    }
}
