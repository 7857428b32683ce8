//! OpenAI-compatible request types (`/v1/chat/completions`, `/v1/completions`) and the
//! SGLang-style native `/generate` request. Nothing a client sends is silently ignored: known
//! fields Nitsum does not implement are read only to refuse them by name when they ask for
//! something (`unsupported`), and an unknown field is refused by name, as OpenAI does
//! (`extensions::refused`), unless it is a vLLM/SGLang extension sent at its neutral value
//! (`protocols::extensions`).

use serde::Deserialize;
use serde_json::Value;

use super::extensions::{not_supported, refused};
use super::sampling_fields::{GenerateBody, SamplingFields};

/// A string or a list of strings (`stop`).
#[derive(Debug, Clone, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(untagged)]
pub enum StringOrList {
    One(String),
    Many(Vec<String>),
}

impl StringOrList {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            StringOrList::One(s) => vec![s],
            StringOrList::Many(v) => v,
        }
    }
}

/// `prompt` of `/v1/completions`: text or token ids (a batch of one is accepted).
#[derive(Debug, Clone, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Ids(Vec<u32>),
    Texts(Vec<String>),
    IdBatch(Vec<Vec<u32>>),
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
    /// vLLM: usage on every chunk, not only at the end.
    #[serde(default)]
    pub continuous_usage_stats: bool,
    /// Any other key: refused by name (`stream_options.<key>`), never ignored.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, Value>,
}

/// Fields shared by chat and text completions (and Nitsum extensions).
#[derive(Debug, Clone, Default, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct CommonParams {
    pub model: Option<String>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub stop: Option<StringOrList>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub n: Option<i64>,
    /// Extension: do not stop at EOS.
    #[serde(default)]
    pub ignore_eos: bool,
    /// Extension: extra token ids that end generation.
    #[serde(default)]
    pub stop_token_ids: Vec<u32>,
    /// Extension: the SLO tier (the `x-nitsum-tier` header wins).
    pub tier: Option<String>,
    /// vLLM's extension: within its class on the worker, lower is served first.
    pub priority: Option<i64>,
    /// Chat: a boolean (with `top_logprobs` alternatives); completions: the number of
    /// alternatives, 0..=20 (api/logprobs.rs reads it per endpoint).
    pub logprobs: Option<Value>,
    pub top_logprobs: Option<i64>,
    /// EOS and stop token ids are masked until this many tokens were generated.
    pub min_tokens: Option<i64>,
    /// The sampler's knobs, the same in the native API (protocols/sampling_fields.rs).
    #[serde(flatten)]
    pub sampling: SamplingFields,
    /// Structured output and tool calling (protocols/structured.rs, protocols/tools.rs).
    pub tools: Option<Value>,
    pub tool_choice: Option<Value>,
    pub response_format: Option<Value>,
    /// OpenAI fields not implemented (`unsupported` refuses them when they ask for anything).
    pub best_of: Option<Value>,
    pub suffix: Option<Value>,
    /// vLLM's extensions Nitsum implements (protocols/vllm_fields.rs, api/fields.rs).
    #[serde(flatten)]
    pub vllm: super::vllm_fields::VllmFields,
    /// Every other field, checked by `extensions::refused`.
    /// NOTE: declared last: serde hands a flattened map only what no named field took.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, Value>,
}

impl CommonParams {
    /// The `stop` strings (none when absent).
    pub fn stop_strings(&self) -> Vec<String> {
        self.stop
            .clone()
            .map(StringOrList::into_vec)
            .unwrap_or_default()
    }

    /// Whether a stream ends with a usage chunk (`stream_options.include_usage`).
    pub fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage)
    }
}

impl GenerateBody for CommonParams {
    fn sampling_fields(&self) -> &SamplingFields {
        &self.sampling
    }

    /// `max_completion_tokens` wins over `max_tokens`.
    fn max_tokens(&self) -> (Option<i64>, &'static str) {
        match (self.max_completion_tokens, self.max_tokens) {
            (Some(m), _) => (Some(m), "max_completion_tokens"),
            (None, m) => (m, "max_tokens"),
        }
    }

    fn min_tokens(&self) -> (Option<i64>, &'static str) {
        (self.min_tokens, "min_tokens")
    }

    fn stop_token_ids(&self) -> &[u32] {
        &self.stop_token_ids
    }

    fn ignore_eos(&self) -> bool {
        self.ignore_eos
    }

    fn priority(&self) -> Option<i64> {
        self.priority
    }
}

/// The first unimplemented or unknown field that asks for something, with why: clients send
/// most of them with neutral defaults (`best_of: 1`, `suffix: ""`), which are accepted.
/// NOTE: `tools`, `tool_choice` and `response_format` (protocols/tools.rs,
/// protocols/structured.rs), the sampler's knobs (protocols/sampling_fields.rs) and `logprobs` /
/// `top_logprobs` (api/logprobs.rs) are implemented and checked where they are used.
pub fn unsupported(c: &CommonParams) -> Option<(String, String)> {
    let truthy = |v: &Option<Value>| match v {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::Number(n)) => n.as_f64() != Some(0.0),
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
        Some(Value::Bool(true)) => true,
    };
    let not =
        |v: &Option<Value>, neutral: &[Value]| truthy(v) && !neutral.contains(v.as_ref().unwrap());
    let checks: [(&'static str, bool); 2] = [
        ("best_of", not(&c.best_of, &[Value::from(1)])),
        ("suffix", truthy(&c.suffix)),
    ];
    let stream_option = c.stream_options.iter().flat_map(|o| o.extra.keys()).next();
    checks
        .into_iter()
        .find(|&(_, asks)| asks)
        .map(|(name, _)| (name.to_string(), not_supported(name)))
        .or_else(|| {
            stream_option.map(|k| {
                let name = format!("stream_options.{k}");
                let why = format!("Unrecognized request argument supplied: {name}");
                (name, why)
            })
        })
        .or_else(|| c.vllm.check())
        .or_else(|| refused(&c.extra))
}

/// Chat roles the templates know.
pub const CHAT_ROLES: [&str; 6] = [
    "system",
    "developer",
    "user",
    "assistant",
    "tool",
    "function",
];

/// A chat message; `content` is a string or a list of `{"type": "text", "text": ...}` parts.
#[derive(Debug, Clone, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<Value>,
    /// Any other fields (name, tool_calls, ...) are passed to the chat template as they are.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, Value>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct ChatCompletionRequest {
    /// NOTE: optional here so that a missing field is our own 400 naming `messages`.
    pub messages: Option<Vec<ChatMessage>>,
    /// vLLM's extension: a Jinja chat template used instead of the model's.
    pub chat_template: Option<String>,
    /// vLLM's extension: extra variables for the chat template (an object).
    pub chat_template_kwargs: Option<Value>,
    /// At most one call per reply when false (protocols/tools.rs).
    pub parallel_tool_calls: Option<Value>,
    /// OpenAI's `low`/`medium`/`high`: a chat template variable (api/reasoning_reply.rs).
    pub reasoning_effort: Option<Value>,
    /// vLLM's: `false` drops the reasoning `--reasoning-parser` reads (api/reasoning_reply.rs).
    pub include_reasoning: Option<Value>,
    #[serde(flatten)]
    pub common: CommonParams,
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct CompletionRequest {
    pub prompt: Option<Prompt>,
    /// Echo the prompt text before the completion.
    #[serde(default)]
    pub echo: bool,
    #[serde(flatten)]
    pub common: CommonParams,
}

#[cfg(test)]
#[path = "openai_tests.rs"]
mod tests;
