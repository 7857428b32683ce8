//! Prometheus text of SGLang's core families (`sglang:*`, labelled `model_name`), so that
//! SGLang's stock Grafana dashboard (dashboards/sglang/) shows Nitsum's data: the same
//! router-measured latencies and worker-reported load as the `vllm:*` twins.

use std::fmt::Write;

use super::engine::EngineGauges;
use super::histogram::{family, Histogram};
use super::vllm::VllmMetrics;

impl VllmMetrics {
    /// Prometheus text of every `sglang:*` family.
    pub fn render_sglang(&self, out: &mut String, g: &EngineGauges) {
        let l = &self.labels;
        let hists: [(&str, &str, &Histogram); 2] = [
            (
                "sglang:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                &self.ttft,
            ),
            (
                "sglang:e2e_request_latency_seconds",
                "Histogram of End-to-end request latency in seconds",
                &self.e2e,
            ),
        ];
        for (name, help, h) in hists {
            family(out, name, "histogram", help);
            h.render(out, name, l);
        }
        // NOTE: SGLang's cache_hit_rate is a fraction of prompt tokens found cached; without
        // any worker-reported lookups it has no sample rather than a made-up 0.
        let hit_rate =
            (g.prefix_cache_queries > 0.0).then(|| g.prefix_cache_hits / g.prefix_cache_queries);
        let gauges = [
            (
                "sglang:num_running_reqs",
                "The number of running requests.",
                Some(g.running as f64),
            ),
            (
                "sglang:num_queue_reqs",
                "The number of requests in the waiting queue.",
                Some(g.waiting as f64),
            ),
            (
                "sglang:gen_throughput",
                "The generation throughput (token/s).",
                Some(self.throughput()),
            ),
            (
                "sglang:cache_hit_rate",
                "The prefix cache hit rate.",
                hit_rate,
            ),
        ];
        for (name, help, v) in gauges {
            family(out, name, "gauge", help);
            if let Some(v) = v {
                let _ = writeln!(out, "{name}{{{l}}} {v}");
            }
        }
    }
}
