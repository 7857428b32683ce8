//! `tokens` (worker → router): a request's new tokens, their logprobs, and its end.

use serde::{Deserialize, Serialize};

/// `tokens`: new tokens of one request, and its end.
/// NOTE: `finish_reason` and `error` are sent as null when absent; the optional keys are
/// left out (as the Python worker does).
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Tokens {
    pub request_id: Option<String>,
    pub token_ids: Option<Vec<u32>>,
    pub finish_reason: Option<String>,
    pub error: Option<String>,
    /// With `error`: the request field the worker refused (the client's 400 names it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_param: Option<String>,
    pub prompt_tokens: Option<u32>,
    /// Milliseconds the worker held the request before its first scheduled step (optional;
    /// sent with the request's first tokens): the queue / prefill split of `/metrics`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_ms: Option<f64>,
    /// One per token id when the request asked for logprobs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Vec<TokenLogprob>>,
    /// With the first token, when the request asked: its prompt tokens' after the first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<Vec<TokenLogprob>>,
    /// With the first token: its prompt tokens found in the worker's prefix cache.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cached_tokens: Option<u32>,
}

/// A sampled token's logprob and its top alternatives `(token id, logprob)`, most likely
/// first (docs/protocol.md `tokens`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TokenLogprob {
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}
