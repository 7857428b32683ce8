//! `POST /v1/chat/completions`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use futures_util::future::try_join_all;
use serde_json::{json, Value};

use super::fields;
use super::logprobs;
use super::output::{self, Piece, TextStream};
use super::prepare::{self, SamplingInput};
use super::sse::{self, ChunkFormat};
use super::tool_reply::{self, CallFormat};
use super::{unix_now, AppState};
use crate::errors::ApiError;
use crate::protocols::openai::{parse_body, ChatCompletionRequest, ChatMessage};
use crate::protocols::structured::{self, Grammar};
use crate::protocols::tools::{self, Tools};
use crate::protocols::worker::TokenLogprob;
use crate::tokenize::ModelFiles;

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
    /// Whether the request asked for logprobs (the tokenizer names their tokens).
    logprobs: bool,
    files: Option<Arc<ModelFiles>>,
    /// Set when tool calls are read from the reply: each choice's text (and its tokens'
    /// logprobs) is held back until its end.
    calls: Option<CallFormat>,
    held: Vec<Held>,
    /// vLLM's `return_tokens_as_token_ids` (api/fields.rs).
    tokens_as_ids: bool,
}

/// A choice's reply held back while tool calls are read from it.
#[derive(Debug, Default)]
struct Held {
    text: String,
    ids: Vec<u32>,
    logprobs: Vec<TokenLogprob>,
}

impl ChatChunks {
    fn chunk(&self, index: usize, delta: Value, finish: Option<&str>, logprobs: Value) -> Value {
        json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
               "model": self.model,
               "choices": [{"index": index, "delta": delta, "logprobs": logprobs,
                            "finish_reason": finish}]})
    }

    /// The choice's `logprobs` for `ids` (null when the request did not ask).
    fn logprobs(&self, ids: &[u32], lps: &[TokenLogprob]) -> Value {
        if !self.logprobs {
            return Value::Null;
        }
        let mut content = logprobs::chat_content(self.files.as_deref(), ids, lps);
        if self.tokens_as_ids {
            fields::name_tokens_by_id(&mut content, ids, lps);
        }
        json!({"content": content})
    }
}

impl ChunkFormat for ChatChunks {
    fn start(&mut self, index: usize, _ts: &TextStream) -> Vec<Value> {
        let role = json!({"role": "assistant", "content": ""});
        vec![self.chunk(index, role, None, Value::Null)]
    }

    fn piece(&mut self, index: usize, ts: &TextStream, p: &Piece) -> Vec<Value> {
        let mut out = Vec::new();
        if let Some(format) = self.calls {
            // NOTE: a call is only known once its text is complete, so nothing streams before.
            if self.held.len() <= index {
                self.held.resize_with(index + 1, Held::default);
            }
            let held = &mut self.held[index];
            held.text.push_str(&p.text);
            held.ids.extend_from_slice(&p.ids);
            held.logprobs.extend_from_slice(&p.logprobs);
            if let Some(f) = p.finish {
                let held = std::mem::take(&mut self.held[index]);
                // NOTE: each choice's calls get ids of its own request (`chatcmpl-<id>` is the
                // response id for choice 0, so n = 1 is unchanged).
                let rid = format!("chatcmpl-{}", ts.id);
                let (mut deltas, finish) = tool_reply::final_deltas(format, &rid, held.text, f);
                let mut lps = self.logprobs(&held.ids, &held.logprobs);
                if deltas.is_empty() && !lps.is_null() {
                    deltas.push(json!({"content": ""})); // the logprobs still go out
                }
                for d in deltas {
                    // The held tokens' logprobs ride on the first closing delta.
                    let lp = std::mem::take(&mut lps);
                    out.push(self.chunk(index, d, None, lp));
                }
                out.push(self.chunk(index, json!({}), Some(finish), Value::Null));
            }
            return out;
        }
        // NOTE: tokens whose text is still incomplete get their logprobs now, with "".
        if !p.text.is_empty() || (self.logprobs && !p.logprobs.is_empty()) {
            let lps = self.logprobs(&p.ids, &p.logprobs);
            out.push(self.chunk(index, json!({"content": p.text}), None, lps));
        }
        if let Some(f) = p.finish {
            out.push(self.chunk(index, json!({}), Some(f), Value::Null));
        }
        out
    }

    fn end(&mut self, all: &[TextStream]) -> Vec<Value> {
        let (id, model) = (&self.id, &self.model);
        sse::usage_chunk(
            self.include_usage,
            id,
            "chat.completion.chunk",
            self.created,
            model,
            all,
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
    let (tier, n) = prepare::openai_common(&state, &headers, &req.common)?;
    let mut sampling = SamplingInput::from_common(&req.common);
    sampling.logprobs = logprobs::chat_request(&req.common)?;
    let messages = req
        .messages
        .as_deref()
        .ok_or_else(|| ApiError::invalid("messages", "missing required field `messages`"))?;
    let tools = tools::parse(req.common.tools.as_ref(), req.common.tool_choice.as_ref())
        .map_err(|(field, why)| ApiError::invalid(field, why))?;
    sampling.grammar = grammar(&req, tools.as_ref())?;
    let replies = fields::apply(&state, &req.common, &mut sampling).await?;
    fields::want_prompt_logprobs(&mut sampling, &replies);
    let prompt = render(&state, messages, tools.as_ref())?;
    // NOTE: the template already inserts BOS where the model wants it.
    let ids = prepare::encode(&state, &prompt, false, "messages").await?;
    let ids = fields::truncate(&state, &req.common, ids);
    let prompt_ids = ids.clone();
    let stops = req.common.stop_strings();
    let mut all = prepare::start_choices(&state, tier, ids, "messages", &sampling, stops, n)?;
    replies.log(&all);
    let fmt = ChatChunks {
        id: replies.response_id("chatcmpl-", all[0].id),
        model: state.served_model().to_string(),
        created: unix_now(),
        include_usage: req.common.include_usage(),
        logprobs: sampling.logprobs.is_some(),
        files: state.model.clone(),
        calls: CallFormat::of(tools.as_ref()),
        held: Vec::new(),
        tokens_as_ids: replies.tokens_as_ids,
    };
    if req.common.stream {
        return Ok(sse::respond(
            all,
            super::fields_stream::Shaped::new(fmt, replies),
        ));
    }
    let outs = try_join_all(all.iter_mut().map(TextStream::collect)).await?;
    let choice_ids: Vec<Vec<u32>> = outs.iter().map(|(_, ids, _)| ids.clone()).collect();
    let choices: Vec<Value> = outs
        .into_iter()
        .zip(&all)
        .enumerate()
        .map(|(index, ((text, ids, finish), ts))| {
            let rid = format!("chatcmpl-{}", ts.id);
            let (message, finish) = tool_reply::message(fmt.calls, &rid, text, finish);
            json!({"index": index, "message": message,
                   "logprobs": fmt.logprobs(&ids, &ts.logprobs), "finish_reason": finish})
        })
        .collect();
    let mut body = json!({
        "id": fmt.id, "object": "chat.completion", "created": fmt.created, "model": fmt.model,
        "choices": choices,
        "usage": output::usage(&all),
    });
    let choice_ids: Vec<&[u32]> = choice_ids.iter().map(Vec::as_slice).collect();
    replies.finish_body(
        &mut body,
        &prompt_ids,
        &all,
        &choice_ids,
        state.model.as_deref(),
    );
    Ok(axum::Json(body).into_response())
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
