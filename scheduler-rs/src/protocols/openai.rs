//! OpenAI-compatible request types (`/v1/chat/completions`, `/v1/completions`) and the
//! SGLang-style native `/generate` request. Nothing a client sends is silently ignored: known
//! fields Nitsum does not implement are read only to refuse them by name when they ask for
//! something (`unsupported`), and an unknown field is refused by name, as OpenAI does
//! (`extensions::refused`), unless it is a vLLM/SGLang extension sent at its neutral value
//! (`protocols::extensions`).

use serde::Deserialize;
use serde_json::Value;

use super::extensions::{not_supported, refused};

/// A string or a list of strings (`stop`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
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
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Ids(Vec<u32>),
    Texts(Vec<String>),
    IdBatch(Vec<Vec<u32>>),
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
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
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct CommonParams {
    pub model: Option<String>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub seed: Option<u64>,
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
    /// Logit processors (vLLM's semantics): penalties over generated tokens
    /// (presence/frequency) or prompt and output (repetition).
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub repetition_penalty: Option<f64>,
    /// Token id (a decimal string key, as OpenAI sends it) → bias in [-100, 100].
    pub logit_bias: Option<std::collections::HashMap<String, f64>>,
    /// EOS and stop token ids are masked until this many tokens were generated.
    pub min_tokens: Option<i64>,
    pub min_p: Option<f64>,
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

/// The first unimplemented or unknown field that asks for something, with why: clients send
/// most of them with neutral defaults (`best_of: 1`, `suffix: ""`), which are accepted.
/// NOTE: `tools`, `tool_choice` and `response_format` (protocols/tools.rs,
/// protocols/structured.rs), the logit processors (api/processors.rs) and `logprobs` /
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
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<Value>,
    /// Any other fields (name, tool_calls, ...) are passed to the chat template as they are.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, Value>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct ChatCompletionRequest {
    /// NOTE: optional here so that a missing field is our own 400 naming `messages`.
    pub messages: Option<Vec<ChatMessage>>,
    /// vLLM's extension: a Jinja chat template used instead of the model's.
    pub chat_template: Option<String>,
    /// vLLM's extension: extra variables for the chat template (an object).
    pub chat_template_kwargs: Option<Value>,
    /// At most one call per reply when false (protocols/tools.rs).
    pub parallel_tool_calls: Option<Value>,
    #[serde(flatten)]
    pub common: CommonParams,
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct CompletionRequest {
    pub prompt: Option<Prompt>,
    /// Echo the prompt text before the completion.
    #[serde(default)]
    pub echo: bool,
    #[serde(flatten)]
    pub common: CommonParams,
}

/// `sampling_params` of the native `/generate`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
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
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum NativeIds {
    One(Vec<u32>),
    Batch(Vec<Vec<u32>>),
}

/// `POST /generate` (SGLang-style): token ids or text in, token ids (and text) out.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
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

/// Parse a JSON body into `T`, mapping failures to the OpenAI error shape.
pub fn parse_body<T: serde::de::DeserializeOwned>(
    body: &[u8],
) -> Result<T, crate::errors::ApiError> {
    // NOTE: a type error names its field (`param`), as a hand-written check would: from the
    // deserializer's path, or, for fields inside `#[serde(flatten)]` (whose errors lose the
    // path and point at the object's end), by finding the one top-level field that fails alone.
    // NOTE: `end` refuses bytes after the value (a second object, garbage): serde_json's
    // `from_slice` checks that, a bare `Deserializer` does not, and a request that is not one
    // JSON value must not half-run.
    let de = &mut serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut *de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let param = if !inner.is_data() {
            None // a syntax error: no field to name
        } else if !matches!(path.as_str(), "" | "." | "?") {
            Some(path)
        } else {
            failing_field::<T>(body)
        };
        let mut err =
            crate::errors::ApiError::bad_json(format!("could not parse the JSON body: {inner}"));
        err.param = param;
        err
    })?;
    de.end().map_err(|e| {
        crate::errors::ApiError::bad_json(format!(
            "could not parse the JSON body: bytes after the JSON value ({e})"
        ))
    })?;
    Ok(value)
}

/// The top-level field of a JSON object body that `T` cannot take even on its own (every
/// request type here has only optional fields, so one field alone parses unless it is bad).
fn failing_field<T: serde::de::DeserializeOwned>(body: &[u8]) -> Option<String> {
    let serde_json::Value::Object(fields) = serde_json::from_slice(body).ok()? else {
        return None;
    };
    fields.into_iter().find_map(|(name, value)| {
        let alone = serde_json::Value::Object([(name.clone(), value)].into_iter().collect());
        serde_json::from_value::<T>(alone).is_err().then_some(name)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_type_error_names_its_field_even_inside_flattened_fields() {
        let e =
            parse_body::<ChatCompletionRequest>(br#"{"messages": [], "seed": "abc"}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("seed"), "{e:?}");
        let body = b"{\"model\": \"m\",\n \"stream_options\": {\"include_usage\": \"no\"}}";
        let e = parse_body::<ChatCompletionRequest>(body).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("stream_options"));
        let e = parse_body::<ChatCompletionRequest>(br#"{"messages": "hi"}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages"));
        let e = parse_body::<ChatCompletionRequest>(b"{not json").unwrap_err();
        assert_eq!(e.param, None);
    }

    #[test]
    fn bytes_after_the_json_value_are_refused() {
        for body in [
            &br#"{"model": "m"} {"model": "n"}"#[..],
            br#"{"model": "m"}garbage"#,
            br#"{"model": "m"}]"#,
        ] {
            let e = parse_body::<ChatCompletionRequest>(body).unwrap_err();
            assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST);
            assert!(e.message.contains("after the JSON value"), "{e:?}");
            assert_eq!(e.code, Some("invalid_json"));
        }
        // Whitespace after the value is not content.
        let ok = parse_body::<ChatCompletionRequest>(b"{\"model\": \"m\"}\r\n \t");
        assert_eq!(ok.unwrap().common.model.as_deref(), Some("m"));
    }

    #[test]
    fn sampling_and_structured_fields_are_typed_and_only_the_rest_is_refused() {
        let c: CommonParams = serde_json::from_value(serde_json::json!({
            "logprobs": true, "top_logprobs": 2, "presence_penalty": 0.5,
            "frequency_penalty": 0.1, "repetition_penalty": 1.1, "logit_bias": {"5": 1.0},
            "min_tokens": 1, "min_p": 0.1, "n": 2,
            "response_format": {"type": "json_object"}, "tools": [], "tool_choice": "auto",
            "best_of": 1, "user": "u",
        }))
        .unwrap();
        // Every implemented field was taken by its typed member: `extra` holds `user` only.
        assert_eq!(c.extra.keys().collect::<Vec<_>>(), ["user"]);
        assert_eq!(unsupported(&c), None);
        let refused = |body: serde_json::Value| {
            unsupported(&serde_json::from_value(body).unwrap()).map(|(name, _)| name)
        };
        assert_eq!(
            refused(serde_json::json!({"min_p": 0.1, "best_of": 2})).as_deref(),
            Some("best_of")
        );
        assert_eq!(
            refused(serde_json::json!({"logprobs": 3, "suffix": "x"})).as_deref(),
            Some("suffix")
        );
        assert_eq!(
            refused(serde_json::json!({"min_p": 0.1, "temprature": 1})).as_deref(),
            Some("temprature")
        );
    }

    #[test]
    fn prompt_and_stop_accept_both_shapes() {
        let r: CompletionRequest =
            serde_json::from_str(r#"{"prompt": [1, 2], "stop": "x", "tier": "strict"}"#).unwrap();
        assert_eq!(r.prompt, Some(Prompt::Ids(vec![1, 2])));
        assert_eq!(r.common.stop.unwrap().into_vec(), ["x"]);
        assert_eq!(r.common.tier.as_deref(), Some("strict"));
        let r: CompletionRequest =
            serde_json::from_str(r#"{"prompt": "hi", "stop": ["a", "b"], "foo": 1}"#).unwrap();
        assert_eq!(r.prompt, Some(Prompt::Text("hi".into())));
        assert_eq!(r.common.stop.unwrap().into_vec(), ["a", "b"]);
        let chat: ChatCompletionRequest = serde_json::from_str(
            r#"{"model": "m", "messages": [{"role": "user", "content": "hi", "name": "x"}]}"#,
        )
        .unwrap();
        let msgs = chat.messages.unwrap();
        assert_eq!(msgs[0].extra["name"], "x");
        assert!(serde_json::from_str::<CompletionRequest>(r#"{"temperature": "hot"}"#).is_err());
    }
}
