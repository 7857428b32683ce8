//! The router's HTTP replies, described for `/openapi.json` (api/openapi.rs).
//!
//! NOTE: the handlers build these bodies as JSON values (api/*.rs); each type here names the
//! fields every such body carries, with their types, so a client generated from the spec (and
//! the fuzzer of tests/test_openapi_fuzz.py) can rely on them. Other fields may come too
//! (vLLM's and SGLang's extras): no type here forbids them.

use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

/// Every error: `{"error": {...}}`, OpenAI's shape.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorReply {
    pub error: ErrorBody,
}

/// What went wrong, and with which request field.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    pub message: String,
    /// OpenAI's error type (`invalid_request_error`, `authentication_error`, ...).
    #[serde(rename = "type")]
    pub kind: String,
    /// The offending request field.
    pub param: Option<String>,
    pub code: Option<String>,
}

/// Tokens a request used; `prompt_tokens_details.cached_tokens` came from the prefix cache.
#[derive(Debug, Serialize, ToSchema)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
}

/// The assistant's message of a chat choice.
#[derive(Debug, Serialize, ToSchema)]
pub struct ReplyMessage {
    pub role: String,
    /// Null when the reply is tool calls only.
    pub content: Option<String>,
}

/// One chat choice.
#[derive(Debug, Serialize, ToSchema)]
pub struct ChatChoice {
    pub index: u32,
    pub message: ReplyMessage,
    pub finish_reason: Option<String>,
}

/// `POST /v1/chat/completions` without `stream`.
#[derive(Debug, Serialize, ToSchema)]
pub struct ChatCompletion {
    pub id: String,
    /// `chat.completion`.
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
}

/// One completion choice.
#[derive(Debug, Serialize, ToSchema)]
pub struct CompletionChoice {
    pub index: u32,
    pub text: String,
    pub finish_reason: Option<String>,
}

/// `POST /v1/completions` without `stream`.
#[derive(Debug, Serialize, ToSchema)]
pub struct Completion {
    pub id: String,
    /// `text_completion`.
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    pub usage: Usage,
}

/// `POST /v1/responses` without `stream`: OpenAI's response object.
#[derive(Debug, Serialize, ToSchema)]
pub struct ResponseObject {
    pub id: String,
    /// `response`.
    pub object: String,
    pub created_at: u64,
    pub status: String,
    pub model: String,
    /// Output items (messages, function calls).
    pub output: Vec<Value>,
}

/// One result of `POST /generate` (SGLang's).
#[derive(Debug, Serialize, ToSchema)]
pub struct GenerateResult {
    pub text: String,
    pub output_ids: Vec<u32>,
    /// `id`, `prompt_tokens`, `completion_tokens`, `finish_reason`, `e2e_latency`, ...
    pub meta_info: Value,
}

/// `POST /generate`: one result, or a list for a batch or `n` > 1.
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
pub enum GenerateReply {
    One(GenerateResult),
    Many(Vec<GenerateResult>),
}

/// A served model (with vLLM's `max_model_len`, `root` and `parent`).
#[derive(Debug, Serialize, ToSchema)]
pub struct ModelCard {
    pub id: String,
    /// `model`.
    pub object: String,
    pub created: u64,
    pub owned_by: String,
    pub root: String,
    pub parent: Option<String>,
    pub max_model_len: u64,
}

/// `GET /v1/models`.
#[derive(Debug, Serialize, ToSchema)]
pub struct ModelList {
    /// `list`.
    pub object: String,
    pub data: Vec<ModelCard>,
}

/// `POST /tokenize`.
#[derive(Debug, Serialize, ToSchema)]
pub struct Tokenized {
    pub tokens: Vec<u32>,
    pub count: u64,
    pub max_model_len: u64,
    /// With `return_token_strs`: the tokenizer's string of each token.
    pub token_strs: Option<Vec<String>>,
}

/// `POST /detokenize` (vLLM's `prompt` and SGLang's `text`, the same).
#[derive(Debug, Serialize, ToSchema)]
pub struct Detokenized {
    pub prompt: String,
    pub text: String,
}

/// `GET /version`.
#[derive(Debug, Serialize, ToSchema)]
pub struct Version {
    pub version: String,
    pub server: String,
}

/// `GET /health`, `/ping`: `ok` with a registered worker (200), else `no_workers` (503).
#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    pub status: String,
    pub workers: u64,
    pub plan_epoch: u64,
}

/// `GET /load` (vLLM's).
#[derive(Debug, Serialize, ToSchema)]
pub struct Load {
    /// Requests the router holds.
    pub server_load: u64,
}

/// `GET /get_model_info` (SGLang's).
#[derive(Debug, Serialize, ToSchema)]
pub struct ModelInfo {
    pub model_path: String,
    pub served_model_name: String,
    pub is_generation: bool,
    pub max_model_len: u64,
}

/// `GET /server_info` (SGLang's).
#[derive(Debug, Serialize, ToSchema)]
pub struct ServerInfo {
    pub version: String,
    pub server: String,
    pub served_model_name: String,
    pub tiers: Vec<Value>,
    pub internal_states: Vec<Value>,
}

/// `POST /flush_cache`: how many workers were told to flush.
#[derive(Debug, Serialize, ToSchema)]
pub struct Flushed {
    pub workers: u64,
}

/// `GET /tokenizer_info` (vLLM's): `tokenizer_config.json`'s fields with special tokens as
/// their text, the tokenizer's class and the chat template in use (tokenize/info.rs).
#[derive(Debug, Serialize, ToSchema)]
pub struct TokenizerInfo {
    pub tokenizer_class: String,
    pub chat_template: Option<String>,
    pub eos_token: Option<String>,
    pub bos_token: Option<String>,
    pub pad_token: Option<String>,
}

/// `GET /admin/plan` (docs/router.md).
#[derive(Debug, Serialize, ToSchema)]
pub struct AdminPlan {
    pub epoch: u64,
    pub groups: Vec<Value>,
    pub workers: Vec<Value>,
    pub control: bool,
    pub history: Vec<Value>,
}

/// `POST /v1/responses` (OpenAI's Responses API), as far as Nitsum reads it: the handler takes
/// the body as an object and turns it into a chat request (protocols/responses/), so the chat
/// request's sampling fields are accepted too.
#[derive(Debug, Serialize, ToSchema)]
pub struct ResponsesRequest {
    pub model: Option<String>,
    /// A string, or a list of messages and `function_call` / `function_call_output` items.
    pub input: Value,
    /// A system message before `input`.
    pub instructions: Option<String>,
    pub max_output_tokens: Option<u64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub stream: Option<bool>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    /// `{"format": {...}}`: structured output.
    pub text: Option<Value>,
}
