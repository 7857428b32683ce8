//! `generate` (router → group leader): one request's prompt ids, sampling parameters and
//! the tier's scheduling hints.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use super::frame::encode;
use crate::ids::WorkerId;
use crate::protocols::structured::Grammar;

/// Sampling parameters of a `generate` message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sampling {
    pub max_tokens: u32,
    pub temperature: f32,
    pub top_p: f32,
    /// -1 = off.
    pub top_k: i32,
    pub seed: Option<u64>,
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    /// Logit processors (0, 0, 1, empty, 0, 0: off); see python/nitsum/sampling_processors.py.
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub repetition_penalty: f32,
    /// `[token id, bias]` pairs (a list: msgpack maps with integer keys are refused by the
    /// Python decoder's `strict_map_key`).
    pub logit_bias: Vec<(u32, f32)>,
    /// EOS and stop token ids are masked until this many tokens were generated.
    pub min_tokens: u32,
    pub min_p: f32,
    /// Alternatives per token to return with logprobs; `None`: no logprobs.
    pub logprobs: Option<u32>,
    /// The last this-many `input_ids` are output streamed before a resume: the worker's
    /// penalties count them as output (0: a fresh request).
    #[serde(default)]
    pub resumed_tokens: u32,
    /// Alternatives per prompt token with the prompt's logprobs (echo); `None`: none.
    #[serde(default)]
    pub prompt_logprobs: Option<u32>,
    /// vLLM's `allowed_token_ids`: only these may be sampled (empty: any).
    #[serde(default)]
    pub allowed_token_ids: Vec<u32>,
    /// vLLM's `bad_words` as token id sequences: a sequence's last id is banned when the
    /// output ends with the ids before it.
    #[serde(default)]
    pub bad_words: Vec<Vec<u32>>,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling {
            max_tokens: 16,
            temperature: 1.0,
            top_p: 1.0,
            top_k: -1,
            seed: None,
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            logit_bias: Vec::new(),
            min_tokens: 0,
            min_p: 0.0,
            logprobs: None,
            resumed_tokens: 0,
            prompt_logprobs: None,
            allowed_token_ids: Vec::new(),
            bad_words: Vec::new(),
        }
    }
}

fn unit_weight() -> f64 {
    1.0
}

/// `generate` (router → group leader).
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct Generate<'a> {
    pub v: u32,
    #[serde(rename = "type")]
    pub ty: &'a str,
    pub request_id: &'a str,
    pub input_ids: Cow<'a, [u32]>,
    pub sampling: Cow<'a, Sampling>,
    pub tier: &'a str,
    pub class: &'a str,
    /// The decode group's leader when this group only prefills: the worker to hand KV to.
    pub decode_target: Option<WorkerId>,
    /// The tier's TTFT target (ms) for SLO tiers: the worker's local scheduler serves a
    /// request that has not started within it last (it can no longer meet its SLO).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttft_ms: Option<f64>,
    /// The tier's TPOT target (ms) for SLO tiers: what the worker's binding cost model
    /// (binding/) weighs a request's decode against.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tpot_ms: Option<f64>,
    /// The tier's goodput weight (`Tier::weight`): the binding cost model's value of the
    /// request against the requests a binding delays.
    #[serde(default = "unit_weight")]
    pub weight: f64,
    /// Within its class, lower is served first (0 when absent).
    pub priority: i32,
    /// May preempt running requests of a lower class or priority (the tier's `preempt`).
    pub preempt: bool,
    /// Run on a TP group of this size bound for the request (the tier's `bind_tp`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bind_tp: Option<u32>,
    /// The first of n > 1 choices of the same prompt, whose prefill this one shares.
    #[serde(skip_serializing_if = "Option::is_none", borrow, default)]
    pub fork_of: Option<&'a str>,
    /// vLLM's `truncate_prompt_tokens`: the worker serves only the last this-many
    /// `input_ids` (left truncation); absent: the whole prompt.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub truncate_prompt_tokens: Option<u32>,
    /// Structured output: the grammar the output must match (absent: none).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub grammar: Option<Cow<'a, Grammar>>,
    /// vLLM's `cache_salt`: only requests with the same salt share prefix-cached KV.
    #[serde(skip_serializing_if = "Option::is_none", borrow, default)]
    pub cache_salt: Option<&'a str>,
}

/// Encode `generate`.
pub fn encode_generate(msg: &Generate<'_>) -> Vec<u8> {
    encode(msg)
}
