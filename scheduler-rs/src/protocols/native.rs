//! The SGLang-style native `POST /generate` request: token ids or text in, token ids (and
//! text) out. As with the OpenAI types (openai.rs), nothing a client sends is silently ignored:
//! a field no member takes is refused unless it is an extension at its neutral value.

use serde::Deserialize;
use serde_json::Value;

use super::openai::StringOrList;
use super::sampling_fields::{GenerateBody, SamplingFields};

/// `sampling_params` of the native `/generate`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct NativeSampling {
    pub max_new_tokens: Option<i64>,
    pub stop: Option<StringOrList>,
    #[serde(default)]
    pub stop_token_ids: Vec<u32>,
    #[serde(default)]
    pub ignore_eos: bool,
    pub min_new_tokens: Option<i64>,
    /// The sampler's knobs, the same in the OpenAI API (protocols/sampling_fields.rs).
    #[serde(flatten)]
    pub sampling: SamplingFields,
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

impl GenerateBody for NativeSampling {
    fn sampling_fields(&self) -> &SamplingFields {
        &self.sampling
    }

    fn max_tokens(&self) -> (Option<i64>, &'static str) {
        (self.max_new_tokens, "max_new_tokens")
    }

    fn min_tokens(&self) -> (Option<i64>, &'static str) {
        (self.min_new_tokens, "min_new_tokens")
    }

    fn stop_token_ids(&self) -> &[u32] {
        &self.stop_token_ids
    }

    fn ignore_eos(&self) -> bool {
        self.ignore_eos
    }
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
