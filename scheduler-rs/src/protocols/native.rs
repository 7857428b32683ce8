//! The SGLang-style native `POST /generate` request: token ids or text in, token ids (and
//! text) out. As with the OpenAI types (openai.rs), nothing a client sends is silently ignored:
//! a field no member takes is refused unless it is an extension at its neutral value.

use serde::Deserialize;
use serde_json::Value;

use super::openai::StringOrList;

/// `sampling_params` of the native `/generate`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct NativeSampling {
    pub max_new_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub seed: Option<u64>,
    pub stop: Option<StringOrList>,
    #[serde(default)]
    pub stop_token_ids: Vec<u32>,
    #[serde(default)]
    pub ignore_eos: bool,
    pub frequency_penalty: Option<f64>,
    pub presence_penalty: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub min_new_tokens: Option<i64>,
    pub min_p: Option<f64>,
    pub logit_bias: Option<std::collections::HashMap<String, f64>>,
    /// SGLang's structured output: a JSON Schema, as JSON text.
    pub json_schema: Option<String>,
    /// SGLang's parallel sampling: choices per prompt (as OpenAI's `n`).
    pub n: Option<i64>,
    /// SGLang's structured output: a regular expression the whole output matches.
    pub regex: Option<String>,
    /// SGLang's structured output: an EBNF (GBNF) grammar whose `root` the output matches.
    pub ebnf: Option<String>,
    /// Fields no member above took: refused unless neutral (protocols/extensions.rs).
    /// NOTE: flattened, so it must stay the last field.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, Value>,
}

/// `input_ids` of `/generate`: one prompt or a batch (SGLang answers a batch with a list).
#[derive(Debug, Clone, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(untagged)]
pub enum NativeIds {
    One(Vec<u32>),
    Batch(Vec<Vec<u32>>),
}

/// `POST /generate` (SGLang-style): token ids or text in, token ids (and text) out.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct NativeGenerateRequest {
    /// One prompt's ids, or a batch of them.
    pub input_ids: Option<NativeIds>,
    /// One prompt, or a batch of them.
    pub text: Option<StringOrList>,
    #[serde(default)]
    pub sampling_params: NativeSampling,
    #[serde(default)]
    pub stream: bool,
    pub tier: Option<String>,
    /// Within its class on the worker, lower is served first (vLLM's convention).
    pub priority: Option<i64>,
    /// SGLang's logprobs: of each output token, with `top_logprobs_num` alternatives, the
    /// token texts too with `return_text_in_logprobs`. `logprob_start_len` must be -1 (the
    /// default: no prompt logprobs).
    #[serde(default)]
    pub return_logprob: bool,
    pub top_logprobs_num: Option<i64>,
    pub logprob_start_len: Option<i64>,
    #[serde(default)]
    pub return_text_in_logprobs: bool,
    /// The caller's request id, reported back as `meta_info.id`.
    pub rid: Option<String>,
    /// Fields no member above took: refused unless neutral (protocols/extensions.rs).
    /// NOTE: flattened, so it must stay the last field.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, Value>,
}
