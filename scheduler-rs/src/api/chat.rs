//! `POST /v1/chat/completions`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::output::{Piece, TextStream};
use super::prepare::{self, SamplingInput};
use super::sse::{self, ChunkFormat};
use super::tool_reply::{self, CallFormat};
use super::{unix_now, AppState};
use crate::errors::ApiError;
use crate::protocols::openai::{parse_body, ChatCompletionRequest, ChatMessage};
use crate::protocols::structured::{self, Grammar};
use crate::protocols::tools::{self, Tools};

/// Message content as plain text: a string, or the concatenated `text` parts.
fn content_text(m: &ChatMessage, i: usize) -> Result<String, ApiError> {
    let field = || format!("messages[{i}].content");
    match &m.content {
        // NOTE: only an assistant turn may come without content (e.g. one that made tool
        // calls); OpenAI requires it for every other role.
        None | Some(Value::Null) if m.role == "assistant" => Ok(String::new()),
        None | Some(Value::Null) => Err(ApiError::invalid(
            &field(),
            format!("a `{}` message needs content", m.role),
        )),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut out = String::new();
            for p in parts {
                match (
                    p.get("type").and_then(Value::as_str),
                    p.get("text").and_then(Value::as_str),
                ) {
                    (Some("text"), Some(t)) => out.push_str(t),
                    _ => {
                        return Err(ApiError::invalid(
                            &field(),
                            "only text content parts are supported",
                        ))
                    }
                }
            }
            Ok(out)
        }
        Some(_) => Err(ApiError::invalid(
            &field(),
            "content must be a string or a list of parts",
        )),
    }
}

/// Render the conversation with the model's chat template (showing it `tools`, if any: a
/// template that does not read `tools` cannot, which is a 400 naming `tools`).
pub(super) fn render(
    state: &AppState,
    messages: &[ChatMessage],
    tools: Option<&Tools>,
) -> Result<String, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid("messages", "messages must not be empty"));
    }
    let template = state
        .model
        .as_deref()
        .and_then(|m| m.template.as_ref())
        .ok_or_else(|| ApiError::invalid("messages", "this model has no chat template"))?;
    if tools.is_some() && !template.supports_tools() {
        return Err(ApiError::invalid(
            "tools",
            "this model's chat template does not support tools (it never renders `tools`)",
        ));
    }
    let mut msgs = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        if !crate::protocols::openai::CHAT_ROLES.contains(&m.role.as_str()) {
            return Err(ApiError::invalid(
                &format!("messages[{i}].role"),
                format!(
                    "unknown role `{}` (one of {})",
                    m.role,
                    crate::protocols::openai::CHAT_ROLES.join(", ")
                ),
            ));
        }
        let mut obj = m.extra.clone();
        obj.insert("role".into(), Value::String(m.role.clone()));
        obj.insert("content".into(), Value::String(content_text(m, i)?));
        msgs.push(Value::Object(obj));
    }
    template
        .render_with_tools(&msgs, true, tools.map(|t| t.list.as_slice()))
        .map_err(|e| ApiError::invalid("messages", format!("chat template error: {e}")))
}

struct ChatChunks {
    id: String,
    model: String,
    created: u64,
    include_usage: bool,
    /// Set when tool calls are read from the reply: its text is held back until the end.
    calls: Option<CallFormat>,
    held: String,
}

impl ChatChunks {
    fn chunk(&self, delta: Value, finish: Option<&str>) -> Value {
        json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
               "model": self.model,
               "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]})
    }
}

impl ChunkFormat for ChatChunks {
    fn start(&mut self, _ts: &TextStream) -> Vec<Value> {
        vec![self.chunk(json!({"role": "assistant", "content": ""}), None)]
    }

    fn piece(&mut self, _ts: &TextStream, p: &Piece) -> Vec<Value> {
        let mut out = Vec::new();
        if let Some(format) = self.calls {
            // NOTE: a call is only known once its text is complete, so nothing streams before.
            self.held.push_str(&p.text);
            if let Some(f) = p.finish {
                let text = std::mem::take(&mut self.held);
                let (deltas, finish) = tool_reply::final_deltas(format, &self.id, text, f);
                out.extend(deltas.into_iter().map(|d| self.chunk(d, None)));
                out.push(self.chunk(json!({}), Some(finish)));
            }
            return out;
        }
        if !p.text.is_empty() {
            out.push(self.chunk(json!({"content": p.text}), None));
        }
        if let Some(f) = p.finish {
            out.push(self.chunk(json!({}), Some(f)));
        }
        out
    }

    fn end(&mut self, ts: &TextStream) -> Vec<Value> {
        let (id, model) = (&self.id, &self.model);
        sse::usage_chunk(
            self.include_usage,
            id,
            "chat.completion.chunk",
            self.created,
            model,
            ts,
        )
    }
}

/// Handler.
pub async fn handle(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    prepare::respond(run(state, headers, body).await)
}

async fn run(state: Arc<AppState>, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    let req: ChatCompletionRequest = parse_body(&body)?;
    let tier = prepare::openai_common(&state, &headers, &req.common)?;
    let messages = req
        .messages
        .as_deref()
        .ok_or_else(|| ApiError::invalid("messages", "missing required field `messages`"))?;
    let tools = tools::parse(req.common.tools.as_ref(), req.common.tool_choice.as_ref())
        .map_err(|(field, why)| ApiError::invalid(field, why))?;
    let mut sampling = SamplingInput::from_common(&req.common);
    sampling.grammar = grammar(&req, tools.as_ref())?;
    let prompt = render(&state, messages, tools.as_ref())?;
    // NOTE: the template already inserts BOS where the model wants it.
    let ids = prepare::encode(&state, &prompt, false, "messages").await?;
    let stops = req.common.stop_strings();
    let mut ts = prepare::start(&state, tier, ids, "messages", &sampling, stops)?;
    let fmt = ChatChunks {
        id: format!("chatcmpl-{}", ts.id),
        model: state.served_model().to_string(),
        created: unix_now(),
        include_usage: req.common.include_usage(),
        calls: CallFormat::of(tools.as_ref()),
        held: String::new(),
    };
    if req.common.stream {
        return Ok(sse::respond(ts, fmt));
    }
    let (text, _ids, finish) = ts.collect().await?;
    let (message, finish) = tool_reply::message(fmt.calls, &fmt.id, text, finish);
    Ok(axum::Json(json!({
        "id": fmt.id, "object": "chat.completion", "created": fmt.created, "model": fmt.model,
        "choices": [{"index": 0, "message": message,
                     "logprobs": null, "finish_reason": finish}],
        "usage": ts.usage(),
    }))
    .into_response())
}

/// The grammar the reply must match: `response_format`'s, or a forced tool call's (the two
/// do not combine: a call is JSON of its own shape).
fn grammar(
    req: &ChatCompletionRequest,
    tools: Option<&Tools>,
) -> Result<Option<Grammar>, ApiError> {
    let format = structured::response_format(req.common.response_format.as_ref())
        .map_err(|why| ApiError::invalid(structured::FIELD, why))?;
    let call = match tools {
        Some(t) => t
            .grammar()
            .map_err(|(field, why)| ApiError::invalid(field, why))?,
        None => None,
    };
    match (format, call) {
        (Some(_), Some(_)) => Err(ApiError::invalid(
            structured::FIELD,
            "cannot be combined with a tool_choice that forces a call",
        )),
        (format, call) => Ok(format.or(call)),
    }
}
