//! Engine-level numbers the workers report (heartbeats, `stats`), summed over the workers for
//! the `vllm:*` gauges and counters (docs/metrics.md).

use crate::ids::WorkerId;

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
}

impl EngineGauges {
    /// From the groups' (running, waiting) heartbeat sums and the workers' `stats` fields.
    /// NOTE: workers report `kv_cache_usage_perc` in percent; vLLM's gauge is a fraction.
    pub fn of(running: u64, waiting: u64, stats: &[(WorkerId, String, f64)]) -> Self {
        let values = |name: &'static str| {
            stats
                .iter()
                .filter(move |(_, k, _)| k == name)
                .map(|(_, _, v)| *v)
        };
        let kv: Vec<f64> = values("kv_cache_usage_perc").map(|v| v / 100.0).collect();
        EngineGauges {
            running,
            waiting,
            kv_usage: (!kv.is_empty()).then(|| kv.iter().sum::<f64>() / kv.len() as f64),
            preemptions: values("num_preemptions").sum(),
            prefix_cache_queries: values("prefix_cache_queries").sum(),
            prefix_cache_hits: values("prefix_cache_hits").sum(),
        }
    }
}
