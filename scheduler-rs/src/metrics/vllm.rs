//! vLLM-compatible metrics: the `vllm:*` families a stock vLLM Grafana dashboard queries,
//! labelled `model_name`, exported beside Nitsum's own `nitsum_*` (docs/metrics.md).
//!
//! Names, types, units and buckets follow vLLM v1's Prometheus logger: seconds for times,
//! tokens for counts, KV usage as a fraction (1 = full). Request-level numbers are measured
//! by the router; engine-level ones (running / waiting, KV usage, preemptions, prefix cache)
//! come from the workers' heartbeats and `stats` messages (docs/protocol.md).

use std::sync::atomic::{AtomicU64, Ordering};

use super::histogram::{label_value, Histogram};
use super::Completion;

/// `vllm:time_to_first_token_seconds` buckets (vLLM's).
pub const TTFT_BUCKETS: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// Inter-token and per-request time-per-output-token buckets (vLLM's).
pub const TOKEN_TIME_BUCKETS: [f64; 19] = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// Request-phase latency buckets: e2e, queue, prefill, decode, inference (vLLM's).
pub const LATENCY_BUCKETS: [f64; 21] = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];
/// Per-request token-count buckets: vLLM's 1-2-5 series (it stops at the model's context;
/// a fixed top here, the `+Inf` bucket takes the rest).
pub const LENGTH_BUCKETS: [f64; 16] = [
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0, 20000.0,
    50000.0, 100000.0,
];

/// `vllm:iteration_tokens_total` buckets (vLLM's).
pub const ITERATION_BUCKETS: [f64; 13] = [
    1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
];
/// `vllm:request_params_n` buckets (vLLM's).
pub const N_BUCKETS: [f64; 5] = [1.0, 2.0, 5.0, 10.0, 20.0];
/// `vllm:request_num_preemptions` buckets (vLLM's).
pub const PREEMPTION_BUCKETS: [f64; 7] = [1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0];

/// How a request ended: vLLM's `finished_reason` label of `vllm:request_success_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishedReason {
    /// An EOS or stop token, or a stop string the router matched.
    Stop,
    /// `max_tokens` or the context window.
    Length,
    /// The client went away or the request ran past its deadline.
    Abort,
    /// A worker failure the router could not recover from.
    Error,
}

impl FinishedReason {
    pub const ALL: [FinishedReason; 4] = [
        FinishedReason::Stop,
        FinishedReason::Length,
        FinishedReason::Abort,
        FinishedReason::Error,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FinishedReason::Stop => "stop",
            FinishedReason::Length => "length",
            FinishedReason::Abort => "abort",
            FinishedReason::Error => "error",
        }
    }
}

/// The router-measured request metrics in vLLM's names.
#[derive(Debug)]
pub struct VllmMetrics {
    /// `model_name="…"`: the label every series carries.
    pub(super) labels: String,
    pub ttft: Histogram,
    /// Gap between consecutive token deliveries, per token (`vllm:inter_token_latency_seconds`,
    /// also under vLLM's older name `vllm:time_per_output_token_seconds`).
    pub itl: Histogram,
    /// Per request: (e2e − TTFT) / (output tokens − 1).
    pub request_tpot: Histogram,
    pub e2e: Histogram,
    /// Time the worker held the request before its first scheduled step (reported by the
    /// worker as `queue_ms`); prefill = TTFT − queue, inference = e2e − queue.
    pub queue: Histogram,
    pub prefill: Histogram,
    pub decode: Histogram,
    pub inference: Histogram,
    pub prompt_len: Histogram,
    pub generation_len: Histogram,
    pub prompt_tokens: AtomicU64,
    pub generation_tokens: AtomicU64,
    /// Ended requests, indexed by `FinishedReason as usize`.
    ended: [AtomicU64; 4],
    /// Tokens per worker output message of one request (`vllm:iteration_tokens_total`).
    /// NOTE: the router sees each request's steps, not the worker's batch: one observation
    /// per step of one request, not per engine step.
    pub iteration: Histogram,
    /// Output tokens of each finished choice (`vllm:request_max_num_generation_tokens`; each
    /// choice of an n > 1 request is its own router request).
    pub max_generation: Histogram,
    /// Per client prompt: the `n` and the resolved `max_tokens` it asked for.
    pub params_n: Histogram,
    pub params_max_tokens: Histogram,
    /// Per-request preemptions: declared, no samples until workers report them per request.
    pub preemptions: Histogram,
    /// Prompt tokens each request computed at prefill: its prompt less what its worker found
    /// in the prefix cache (`vllm:request_prefill_kv_computed_tokens`).
    pub prefill_computed: Histogram,
    /// Generation throughput (`sglang:gen_throughput`): (when, tokens) of the last sample and
    /// the rate measured then.
    throughput: std::sync::Mutex<(std::time::Instant, u64, f64)>,
}

impl VllmMetrics {
    pub fn new(model_name: &str) -> Self {
        VllmMetrics {
            labels: format!("model_name=\"{}\"", label_value(model_name)),
            ttft: Histogram::new(&TTFT_BUCKETS),
            itl: Histogram::new(&TOKEN_TIME_BUCKETS),
            request_tpot: Histogram::new(&TOKEN_TIME_BUCKETS),
            e2e: Histogram::new(&LATENCY_BUCKETS),
            queue: Histogram::new(&LATENCY_BUCKETS),
            prefill: Histogram::new(&LATENCY_BUCKETS),
            decode: Histogram::new(&LATENCY_BUCKETS),
            inference: Histogram::new(&LATENCY_BUCKETS),
            prompt_len: Histogram::new(&LENGTH_BUCKETS),
            generation_len: Histogram::new(&LENGTH_BUCKETS),
            prompt_tokens: AtomicU64::new(0),
            generation_tokens: AtomicU64::new(0),
            ended: Default::default(),
            iteration: Histogram::new(&ITERATION_BUCKETS),
            max_generation: Histogram::new(&LENGTH_BUCKETS),
            params_n: Histogram::new(&N_BUCKETS),
            params_max_tokens: Histogram::new(&LENGTH_BUCKETS),
            preemptions: Histogram::new(&PREEMPTION_BUCKETS),
            prefill_computed: Histogram::new(&LENGTH_BUCKETS),
            throughput: std::sync::Mutex::new((std::time::Instant::now(), 0, 0.0)),
        }
    }

    /// A client prompt was submitted with `n` choices of at most `max_tokens` tokens each.
    pub fn on_request(&self, n: usize, max_tokens: u32) {
        self.params_n.observe(n as f64);
        self.params_max_tokens.observe(f64::from(max_tokens));
    }

    /// Output tokens per second since the previous call at least a second ago (SGLang's
    /// `gen_throughput`, which its scheduler measures per logging interval).
    pub fn throughput(&self) -> f64 {
        let now = std::time::Instant::now();
        let tokens = self.generation_tokens.load(Ordering::Relaxed);
        let mut last = self.throughput.lock().unwrap_or_else(|e| e.into_inner());
        let secs = (now - last.0).as_secs_f64();
        if secs >= 1.0 {
            *last = (now, tokens, tokens.saturating_sub(last.1) as f64 / secs);
        }
        last.2
    }

    /// `n` tokens of a request arrived, `gap_s` after its previous ones (None for its first
    /// message: that gap is the TTFT). Each token of the message counts as one inter-token
    /// interval of `gap_s / n`.
    pub fn on_tokens(&self, n: usize, gap_s: Option<f64>) {
        self.generation_tokens
            .fetch_add(n as u64, Ordering::Relaxed);
        if n > 0 {
            self.iteration.observe(n as f64);
        }
        if let Some(gap) = gap_s.filter(|_| n > 0) {
            for _ in 0..n {
                self.itl.observe(gap / n as f64);
            }
        }
    }

    /// A request's prompt was prefilled (its first token arrived); `cached`: the prompt
    /// tokens its worker found in the prefix cache, when it said.
    pub fn on_prefilled(&self, prompt_tokens: usize, cached: Option<u32>) {
        self.prompt_tokens
            .fetch_add(prompt_tokens as u64, Ordering::Relaxed);
        // NOTE: a worker that does not report its cache hits gives no sample: 0 computed
        // tokens would be a guess.
        if let Some(cached) = cached {
            let computed = prompt_tokens.saturating_sub(cached as usize);
            self.prefill_computed.observe(computed as f64);
        }
    }

    /// A request finished with a completion.
    pub fn on_completion(&self, c: &Completion, reason: FinishedReason) {
        self.count(reason);
        self.e2e.observe(c.e2e_s);
        self.prompt_len.observe(c.prompt_tokens as f64);
        self.generation_len.observe(c.tokens as f64);
        self.max_generation.observe(c.tokens as f64);
        let Some(ttft) = c.ttft_s else { return };
        self.ttft.observe(ttft);
        self.decode.observe((c.e2e_s - ttft).max(0.0));
        if let Some(tpot) = c.tpot_s() {
            self.request_tpot.observe(tpot);
        }
        // NOTE: without a worker-reported queue time the split is unknown: not guessed.
        if let Some(q) = c.queue_s {
            self.queue.observe(q);
            self.prefill.observe((ttft - q).max(0.0));
            self.inference.observe((c.e2e_s - q).max(0.0));
        }
    }

    /// A request ended for `reason` (also called by `on_completion`).
    pub fn count(&self, reason: FinishedReason) {
        self.ended[reason as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Requests ended for `reason` so far.
    pub fn ended(&self, reason: FinishedReason) -> u64 {
        self.ended[reason as usize].load(Ordering::Relaxed)
    }
}
