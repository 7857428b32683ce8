//! Prometheus text of the vLLM-compatible families (`vllm:*`, labelled `model_name`).

use std::fmt::Write;
use std::sync::atomic::Ordering;

use super::engine::EngineGauges;
use super::histogram::{family, Histogram};
use super::vllm::{FinishedReason, VllmMetrics};

impl VllmMetrics {
    /// Prometheus text of every `vllm:*` family.
    pub fn render(&self, out: &mut String, g: &EngineGauges) {
        let l = &self.labels;
        let hists: [(&str, &str, &Histogram); 11] = [
            (
                "vllm:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                &self.ttft,
            ),
            (
                "vllm:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
                &self.itl,
            ),
            (
                "vllm:time_per_output_token_seconds",
                "Histogram of time per output token in seconds (inter-token; vLLM's older name).",
                &self.itl,
            ),
            (
                "vllm:request_time_per_output_token_seconds",
                "Histogram of time_per_output_token_seconds per request.",
                &self.request_tpot,
            ),
            (
                "vllm:e2e_request_latency_seconds",
                "Histogram of e2e request latency in seconds.",
                &self.e2e,
            ),
            (
                "vllm:request_queue_time_seconds",
                "Histogram of time spent in WAITING phase for request.",
                &self.queue,
            ),
            (
                "vllm:request_inference_time_seconds",
                "Histogram of time spent in RUNNING phase for request.",
                &self.inference,
            ),
            (
                "vllm:request_prefill_time_seconds",
                "Histogram of time spent in PREFILL phase for request.",
                &self.prefill,
            ),
            (
                "vllm:request_decode_time_seconds",
                "Histogram of time spent in DECODE phase for request.",
                &self.decode,
            ),
            (
                "vllm:request_prompt_tokens",
                "Number of prefill tokens processed.",
                &self.prompt_len,
            ),
            (
                "vllm:request_generation_tokens",
                "Number of generation tokens processed.",
                &self.generation_len,
            ),
        ];
        for (name, help, h) in hists {
            family(out, name, "histogram", help);
            h.render(out, name, l);
        }
        self.render_request_shape(out, g);
        let counters = [
            (
                "vllm:prompt_tokens_total",
                "Number of prefill tokens processed.",
                self.prompt_tokens.load(Ordering::Relaxed) as f64,
            ),
            (
                "vllm:generation_tokens_total",
                "Number of generation tokens processed.",
                self.generation_tokens.load(Ordering::Relaxed) as f64,
            ),
            (
                "vllm:num_preemptions_total",
                "Cumulative number of preemption from the engine.",
                g.preemptions,
            ),
            (
                "vllm:prefix_cache_queries_total",
                "Prefix cache queries, in terms of number of queried tokens.",
                g.prefix_cache_queries,
            ),
            (
                "vllm:prefix_cache_hits_total",
                "Prefix cache hits, in terms of number of cached tokens.",
                g.prefix_cache_hits,
            ),
        ];
        for (name, help, v) in counters {
            family(out, name, "counter", help);
            let _ = writeln!(out, "{name}{{{l}}} {v}");
        }
        let name = "vllm:request_success_total";
        family(
            out,
            name,
            "counter",
            "Count of successfully processed requests.",
        );
        for r in FinishedReason::ALL {
            let _ = writeln!(
                out,
                "{name}{{{l},finished_reason=\"{}\"}} {}",
                r.as_str(),
                self.ended(r)
            );
        }
        let gauges = [
            (
                "vllm:num_requests_running",
                "Number of requests in model execution batches.",
                Some(g.running as f64),
            ),
            (
                "vllm:num_requests_waiting",
                "Number of requests waiting to be processed.",
                Some(g.waiting as f64),
            ),
            (
                "vllm:kv_cache_usage_perc",
                "KV-cache usage. 1 means 100 percent usage.",
                g.kv_usage,
            ),
            (
                "vllm:gpu_cache_usage_perc",
                "GPU KV-cache usage. 1 means 100 percent usage (vLLM's older name).",
                g.kv_usage,
            ),
        ];
        for (name, help, v) in gauges {
            family(out, name, "gauge", help);
            // NOTE: no worker reports KV usage yet: no sample rather than a made-up 0.
            if let Some(v) = v {
                let _ = writeln!(out, "{name}{{{l}}} {v}");
            }
        }
    }

    /// The families of vLLM's request-shape and cache panels (`iteration_tokens_total`,
    /// `request_max_num_generation_tokens`, `request_params_*`, cached prompt tokens, waiting
    /// by reason, `cache_config_info`, admission rejections).
    fn render_request_shape(&self, out: &mut String, g: &EngineGauges) {
        let l = &self.labels;
        let hists: [(&str, &str, &Histogram); 4] = [
            (
                "vllm:iteration_tokens_total",
                "Histogram of number of tokens per engine_step (per request step here).",
                &self.iteration,
            ),
            (
                "vllm:request_max_num_generation_tokens",
                "Histogram of maximum number of requested generation tokens.",
                &self.max_generation,
            ),
            (
                "vllm:request_params_n",
                "Histogram of the n request parameter.",
                &self.params_n,
            ),
            (
                "vllm:request_params_max_tokens",
                "Histogram of the max_tokens request parameter.",
                &self.params_max_tokens,
            ),
        ];
        for (name, help, h) in hists {
            family(out, name, "histogram", help);
            h.render(out, name, l);
        }
        // NOTE: declared without samples: workers do not report per-request preemptions yet,
        // and a made-up 0 would read as "none happened".
        family(
            out,
            "vllm:request_num_preemptions",
            "histogram",
            "Histogram of preemptions per request (not reported by Nitsum's workers yet).",
        );
        let name = "vllm:request_prefill_kv_computed_tokens";
        family(
            out,
            name,
            "histogram",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
        );
        self.prefill_computed.render(out, name, l);
        let counters = [
            (
                "vllm:prompt_tokens_cached_total",
                "Number of cached prompt tokens (local + external).",
                g.prefix_cache_hits,
            ),
            (
                "vllm:admission_rejections_total",
                "Requests the router refused at admission (tier full, unattainable SLO, no worker).",
                g.admission_rejections,
            ),
        ];
        for (name, help, v) in counters {
            family(out, name, "counter", help);
            let _ = writeln!(out, "{name}{{{l}}} {v}");
        }
        let name = "vllm:num_requests_waiting_by_reason";
        family(
            out,
            name,
            "gauge",
            "Number of requests waiting, by why they wait.",
        );
        // NOTE: Nitsum's workers queue only for capacity (KV pages, batch slots).
        let _ = writeln!(out, "{name}{{{l},reason=\"capacity\"}} {}", g.waiting);
        let name = "vllm:cache_config_info";
        family(out, name, "gauge", "Information of the LLM cache config.");
        let _ = writeln!(
            out,
            "{name}{{{l},enable_prefix_caching=\"True\",kv_cache_tokens=\"{}\"}} 1",
            g.kv_tokens
        );
    }
}
