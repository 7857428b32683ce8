//! The cost model's question and answer (`binding/mod.rs`): the request and the replicas a
//! binding would borrow (`BindQuery`, `ReplicaLoad`), and the options it weighed
//! (`BindDecision`, `BindOption`). Copied field for field into `nitsum._core`'s classes for the
//! worker's binder (`python/binding.rs`).

use serde::{Deserialize, Serialize};

/// One plan group inside the block a binding would borrow, as of this iteration boundary.
/// NOTE: its default is an idle DP replica (TP 1), in Rust as in JSON.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ReplicaLoad {
    /// Its TP level (1 for a DP replica).
    #[serde(default = "one")]
    pub tp: u32,
    /// Sequences in its decode batch.
    #[serde(default)]
    pub decoding: u32,
    /// Their mean context (tokens).
    #[serde(default)]
    pub context: f64,
    /// Prompt tokens its next iteration runs besides the request's.
    #[serde(default)]
    pub prefill_tokens: u32,
    /// Its iterations' measured time over the profile's (1: as profiled): a machine that is
    /// shared, hotter or otherwise not the profiled one (the worker keeps a moving average).
    #[serde(default = "unit")]
    pub slowdown: f64,
}

impl Default for ReplicaLoad {
    fn default() -> Self {
        Self {
            tp: 1,
            decoding: 0,
            context: 0.0,
            prefill_tokens: 0,
            slowdown: 1.0,
        }
    }
}

fn one() -> u32 {
    1
}

/// A request a binding is considered for.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BindQuery {
    /// The bound group's TP level.
    pub level: u32,
    /// Prompt tokens still to compute (0: already prefilled: only decode is weighed, and
    /// "prefill"/"dp" both mean running the rest on a replica).
    pub prompt_tokens: u32,
    /// Output tokens still to generate (at least 1).
    pub output_tokens: u32,
    /// Tokens already in its KV (a prefilled request's prompt and output so far).
    #[serde(default)]
    pub context_tokens: u32,
    #[serde(default)]
    pub ttft_ms: Option<f64>,
    #[serde(default)]
    pub tpot_ms: Option<f64>,
    /// Its tier's weight.
    #[serde(default = "unit")]
    pub weight: f64,
    /// The plan groups inside the block (at least one).
    pub replicas: Vec<ReplicaLoad>,
    /// Prompt tokens per iteration (chunked prefill); 0: unchunked.
    #[serde(default)]
    pub token_budget: u32,
    /// Moving the prompt's KV from the bound group back to a replica, per token (ms).
    #[serde(default)]
    pub handoff_ms_per_token: f64,
    /// The bound group's measured forward time over the profile's (as `ReplicaLoad`'s).
    #[serde(default = "unit")]
    pub bound_slowdown: f64,
    /// The replicas' requests: mean output tokens (their loss in requests is tokens over
    /// this) and mean tier weight.
    #[serde(default = "default_output")]
    pub replica_output_tokens: f64,
    #[serde(default = "unit")]
    pub replica_weight: f64,
    /// Until every group of the block is free to bind (ms): the rest of their current
    /// iterations and any binding already holding them. A bound option starts after it (the
    /// replicas keep working meanwhile, so it costs them nothing); 0: at once.
    #[serde(default)]
    pub wait_ms: f64,
}

fn unit() -> f64 {
    1.0
}

fn default_output() -> f64 {
    128.0
}

/// The three ways to serve the request.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum BindMode {
    Dp,
    Prefill,
    Full,
}

/// One option's estimate.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BindOption {
    pub mode: BindMode,
    pub ttft_ms: f64,
    pub tpot_ms: f64,
    /// Probability that the request meets its targets (1 without targets).
    pub meets: f64,
    /// Decode tokens the replicas' requests do not produce meanwhile (vs an idle request).
    pub lost_tokens: f64,
    /// `weight × meets − lost requests × replica weight`.
    pub value: f64,
}

/// The decision and what it weighed.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BindDecision {
    pub mode: BindMode,
    /// The bound group's TP level weighed (the query's).
    pub level: u32,
    /// The replica (index into `replicas`) for DP and for the decode after a prefill binding.
    pub replica: usize,
    /// Chosen value minus DP's (≥ 0).
    pub gain: f64,
    pub options: Vec<BindOption>,
}
