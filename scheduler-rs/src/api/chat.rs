//! `POST /v1/chat/completions`.

use std::borrow::Cow;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::{json, Value};

use super::answer::{self, Collected, WholeBody};
use super::chat_render::{self, RenderOptions};
use super::choices;
use super::fields;
use super::logprobs;
use super::output::{self, Piece, TextStream};
use super::prepare::{self, SamplingInput};
use super::reading::Reading;
use super::reasoning_reply::{self, ReasoningPieces};
use super::sse::{self, ChunkFormat};
use super::tool_reply::{self, CallFormat};
use super::{unix_now, AppState};
use crate::errors::ApiError;
use crate::protocols::body::parse_body;
use crate::protocols::openai::{ChatCompletionRequest, ChatMessage};
use crate::protocols::structured::{self, Grammar};
use crate::protocols::tools::{self, Tools};
use crate::protocols::worker::TokenLogprob;
use crate::tokenize::ModelFiles;

/// Render with the model's template, showing it `tools` (`/tokenize` renders chats this way).
pub(super) fn render(
    state: &AppState,
    messages: &[ChatMessage],
    tools: Option<&Tools>,
) -> Result<String, ApiError> {
    let opts = RenderOptions {
        tools,
        tool_parser: state.router.cfg.parsers.tool_calls,
        ..RenderOptions::default()
    };
    chat_render::render(state, messages, opts)
}

/// A chat request admitted: its choices' output streams and how their text is read.
pub(super) struct Started {
    pub all: Vec<TextStream>,
    /// How the replies' text is read (reasoning, tool calls).
    pub reading: Reading,
    /// Whether the request asked for logprobs.
    pub logprobs: bool,
    /// What the vLLM reply fields add to the answer (fields.rs).
    pub replies: fields::Replies,
    /// The prompt as submitted (after `truncate_prompt_tokens`).
    pub prompt_ids: Vec<u32>,
}

/// Validate, render and submit a chat request (the Responses API comes through here too).
pub(super) async fn start(
    state: &AppState,
    headers: &HeaderMap,
    req: &ChatCompletionRequest,
) -> Result<Started, ApiError> {
    let (tier, n) = prepare::openai_common(state, headers, &req.common)?;
    let mut sampling = SamplingInput::from_body(&req.common);
    sampling.logprobs = logprobs::chat_request(&req.common)?;
    let messages = req
        .messages
        .as_deref()
        .ok_or_else(|| ApiError::invalid("messages", "missing required field `messages`"))?;
    let refuse = |(field, why): (&str, String)| ApiError::invalid(field, why);
    let parallel = tools::parallel(req.parallel_tool_calls.as_ref()).map_err(refuse)?;
    let mut tools =
        tools::parse(req.common.tools.as_ref(), req.common.tool_choice.as_ref()).map_err(refuse)?;
    if let Some(t) = tools.as_mut() {
        t.parallel = parallel;
    }
    let parsers = state.router.cfg.parsers;
    let calls = CallFormat::for_request(tools.as_ref(), &parsers)?;
    let (effort, reasoning) = reasoning_reply::from_request(state, req)?;
    sampling.grammar = grammar(req, tools.as_ref())?;
    let replies = fields::apply(state, &req.common, &mut sampling).await?;
    fields::want_prompt_logprobs(&mut sampling, &replies);
    let needs_special = calls.is_some_and(|c| !c.forced && c.parser.needs_special_tokens());
    if needs_special && req.common.vllm.skip_special_tokens.is_none() {
        // NOTE: the format's markers are special tokens (vLLM turns the skipping off too).
        sampling.output.keep_special = true;
    }
    let opts = RenderOptions {
        tools: tools.as_ref(),
        tool_parser: parsers.tool_calls,
        template: req.chat_template.as_deref(),
        kwargs: req.chat_template_kwargs.as_ref(),
        reasoning_effort: effort.as_deref(),
    };
    let prompt = chat_render::render(state, messages, opts)?;
    // NOTE: the template already inserts BOS where the model wants it.
    let ids = prepare::encode(state, &prompt, false, "messages").await?;
    let ids = fields::truncate(state, &req.common, ids);
    let prompt_ids = ids.clone();
    let stops = req.common.stop_strings();
    let all = choices::start(state, tier, ids, "messages", &sampling, stops, n)?;
    replies.log(&all);
    Ok(Started {
        all,
        reading: Reading { calls, reasoning },
        logprobs: sampling.logprobs.is_some(),
        replies,
        prompt_ids,
    })
}

struct ChatChunks {
    id: String,
    model: String,
    created: u64,
    include_usage: bool,
    /// Whether the request asked for logprobs (the tokenizer names their tokens).
    logprobs: bool,
    files: Option<Arc<ModelFiles>>,
    /// How the replies are read. With tool calls each choice's content (and its tokens'
    /// logprobs) is held back until its end; reasoning streams as it is decided.
    reading: Reading,
    held: Vec<Held>,
    /// vLLM's `return_tokens_as_token_ids` (api/fields.rs).
    tokens_as_ids: bool,
}

/// A choice's reply state: its reasoning parser's, and the content held back while tool
/// calls are read from it.
#[derive(Debug, Default)]
struct Held {
    reasoning: Option<ReasoningPieces>,
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
        if self.held.len() <= index {
            let reading = self.reading;
            self.held.resize_with(index + 1, || Held {
                reasoning: reading.pieces(),
                ..Held::default()
            });
        }
        // NOTE: without a reasoning parser the piece's text is the content, uncopied.
        let (reasoning, content) = match self.held[index].reasoning.as_mut() {
            Some(r) => {
                let s = r.push(&p.text, p.finish.is_some());
                (s.reasoning, Cow::Owned(s.content))
            }
            None => (String::new(), Cow::Borrowed(p.text.as_str())),
        };
        if let Some(format) = self.reading.calls {
            // NOTE: a call is only known once its text is complete, so no content streams
            // before; the reasoning does (its tokens' logprobs ride on the closing deltas).
            if !reasoning.is_empty() {
                let delta = json!({"reasoning_content": reasoning});
                out.push(self.chunk(index, delta, None, Value::Null));
            }
            let held = &mut self.held[index];
            held.text.push_str(&content);
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
        let mut lps = self.logprobs(&p.ids, &p.logprobs);
        if !reasoning.is_empty() {
            let delta = json!({"reasoning_content": reasoning});
            out.push(self.chunk(index, delta, None, std::mem::take(&mut lps)));
        }
        // NOTE: tokens whose text is still incomplete (or held as a possible tag) get their
        // logprobs now, with "".
        if !content.is_empty() || (!lps.is_null() && !p.logprobs.is_empty()) {
            out.push(self.chunk(index, json!({"content": content}), None, lps));
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

impl WholeBody for ChatChunks {
    const OBJECT: &'static str = "chat.completion";

    fn head(&self) -> (&str, u64, &str) {
        (&self.id, self.created, &self.model)
    }

    fn choice(&mut self, index: usize, out: &Collected, ts: &TextStream) -> Value {
        let (text, ids, finish) = out;
        let rid = format!("chatcmpl-{}", ts.id);
        let (message, finish) = self.reading.message(&rid, text, finish);
        json!({"index": index, "message": message,
               "logprobs": self.logprobs(ids, &ts.logprobs), "finish_reason": finish})
    }

    fn usage(&self, all: &[TextStream]) -> Value {
        output::usage(all)
    }
}

/// Handler (an error is answered in the OpenAI shape, `ApiError`'s `IntoResponse`).
pub async fn handle(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: ChatCompletionRequest = parse_body(&body)?;
    let Started {
        all,
        reading,
        logprobs,
        replies,
        prompt_ids,
    } = start(&state, &headers, &req).await?;
    let fmt = ChatChunks {
        id: replies.response_id("chatcmpl-", all[0].id),
        model: state.served_model().to_string(),
        created: unix_now(),
        include_usage: req.common.include_usage(),
        logprobs,
        files: state.model.clone(),
        reading,
        held: Vec::new(),
        tokens_as_ids: replies.tokens_as_ids,
    };
    answer::respond(&state, all, req.common.stream, fmt, replies, &prompt_ids).await
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
