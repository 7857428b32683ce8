//! `generate` (router → group leader): one request's prompt ids and what it asks for, nested
//! by concern: `sampling` (how a token is drawn), `stop` (when the output ends), `output`
//! (what is returned besides the tokens), `contract` (the tier's terms: whom the worker serves
//! first and against which targets) and `routing` (where the request's KV comes from or goes).
//!
//! NOTE: the router checks every value range (protocols/sampling_fields.rs, api/prepare.rs)
//! before it builds one; the worker only type-checks the message
//! (python/nitsum/engine/generate_message.py; its parts are declared in nitsum/sampling.py).

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use super::frame::encode;
use crate::ids::WorkerId;
use crate::protocols::structured::Grammar;

/// How a token is drawn: the sampler's knobs and logit processors. A knob's body field and
/// range check are in protocols/sampling_fields.rs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Sampling {
    pub temperature: f32,
    pub top_p: f32,
    /// -1 = off.
    pub top_k: i32,
    pub seed: Option<u64>,
    /// Logit processors (0, 0, 1, empty, 0: off); see python/nitsum/sampling_processors.py.
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub repetition_penalty: f32,
    /// `[token id, bias]` pairs (a list: msgpack maps with integer keys are refused by the
    /// Python decoder's `strict_map_key`).
    pub logit_bias: Vec<(u32, f32)>,
    pub min_p: f32,
    /// vLLM's `allowed_token_ids`: only these may be sampled (empty: any).
    pub allowed_token_ids: Vec<u32>,
    /// vLLM's `bad_words` as token id sequences: a sequence's last id is banned when the
    /// output ends with the ids before it.
    pub bad_words: Vec<Vec<u32>>,
    /// Every n-gram of this size occurs at most once in prompt and output (0: off).
    pub no_repeat_ngram_size: u32,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling {
            temperature: 1.0,
            top_p: 1.0,
            top_k: -1,
            seed: None,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            logit_bias: Vec::new(),
            min_p: 0.0,
            allowed_token_ids: Vec::new(),
            bad_words: Vec::new(),
            no_repeat_ngram_size: 0,
        }
    }
}

/// When the output ends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Stop {
    pub max_tokens: u32,
    /// EOS and stop token ids are masked until this many tokens were generated.
    pub min_tokens: u32,
    /// Every id that ends the output, the model's EOS included unless `ignore_eos`.
    /// NOTE: the router adds EOS (api/prepare.rs); the worker adds nothing.
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
}

impl Default for Stop {
    fn default() -> Self {
        Stop {
            max_tokens: 16,
            min_tokens: 0,
            stop_token_ids: Vec::new(),
            ignore_eos: false,
        }
    }
}

/// What is returned besides the tokens.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Output {
    /// Alternatives per token to return with logprobs; `None`: no logprobs.
    pub logprobs: Option<u32>,
    /// Alternatives per prompt token with the prompt's logprobs (echo); `None`: none.
    pub prompt_logprobs: Option<u32>,
}

/// The worker's local-scheduler class (architecture §3): the order a batch is filled in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    Feasible,
    BestEffort,
    Background,
}

fn unit_weight() -> f64 {
    1.0
}

/// The tier's terms for this request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Contract<'a> {
    pub tier: &'a str,
    pub class: Class,
    /// The tier's TTFT target (ms) for SLO tiers: the worker's local scheduler serves a
    /// request that has not started within it last (it can no longer meet its SLO).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub ttft_ms: Option<f64>,
    /// The tier's TPOT target (ms) for SLO tiers: what the worker's binding cost model
    /// (binding/) weighs a request's decode against.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub tpot_ms: Option<f64>,
    /// The tier's goodput weight (`Tier::weight`): the binding cost model's value of the
    /// request against the requests a binding delays.
    #[serde(default = "unit_weight")]
    pub weight: f64,
    /// Within its class, lower is served first (0 when absent).
    #[serde(default)]
    pub priority: i32,
    /// May preempt running requests of a lower class or priority (the tier's `preempt`).
    #[serde(default)]
    pub preempt: bool,
    /// Run on a TP group of this size bound for the request (the tier's `bind_tp`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub bind_tp: Option<u32>,
}

/// Where the request's KV comes from or goes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Routing<'a> {
    /// The first of n > 1 choices of the same prompt, whose prefill this one shares.
    #[serde(skip_serializing_if = "Option::is_none", borrow, default)]
    pub fork_of: Option<&'a str>,
    /// The decode group's leader when this group only prefills: the worker to hand KV to.
    #[serde(default)]
    pub decode_target: Option<WorkerId>,
    /// vLLM's `cache_salt`: only requests with the same salt share prefix-cached KV.
    #[serde(skip_serializing_if = "Option::is_none", borrow, default)]
    pub cache_salt: Option<&'a str>,
}

/// `generate` (router → group leader).
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct Generate<'a> {
    pub v: u32,
    #[serde(rename = "type")]
    pub ty: &'a str,
    pub request_id: &'a str,
    pub input_ids: Cow<'a, [u32]>,
    /// The last this-many `input_ids` are output streamed before a resume: the worker's
    /// penalties count them as output (0: a fresh request).
    #[serde(default)]
    pub resumed_tokens: u32,
    pub sampling: Cow<'a, Sampling>,
    pub stop: Cow<'a, Stop>,
    pub output: Cow<'a, Output>,
    #[serde(borrow)]
    pub contract: Contract<'a>,
    #[serde(borrow)]
    pub routing: Routing<'a>,
    /// vLLM's `truncate_prompt_tokens`: the worker serves only the last this-many
    /// `input_ids` (left truncation); absent: the whole prompt.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub truncate_prompt_tokens: Option<u32>,
    /// Structured output: the grammar the output must match (absent: none).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub grammar: Option<Cow<'a, Grammar>>,
}

/// Encode `generate`.
pub fn encode_generate(msg: &Generate<'_>) -> Vec<u8> {
    encode(msg)
}
