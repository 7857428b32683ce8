//! `POST /v1/completions`: `prompt` is text or a list of token ids.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use futures_util::future::try_join_all;
use serde_json::{json, Value};

use super::fields;
use super::logprobs::{self, CompletionLogprobs};
use super::output::{self, Piece, TextStream};
use super::prepare::{self, SamplingInput};
use super::sse::{self, ChunkFormat};
use super::{unix_now, AppState};
use crate::errors::ApiError;
use crate::protocols::openai::{parse_body, CompletionRequest, Prompt};
use crate::protocols::worker::TokenLogprob;
use crate::tokenize::ModelFiles;

/// Prompt token ids, and the prompt text when `echo` needs it.
async fn prompt_ids(
    state: &AppState,
    prompt: Option<Prompt>,
) -> Result<(Vec<u32>, Option<String>), ApiError> {
    let batch = || {
        ApiError::invalid(
            "prompt",
            "batched prompts are not supported; send one prompt",
        )
    };
    match prompt {
        None => Err(ApiError::invalid(
            "prompt",
            "missing required field `prompt`",
        )),
        Some(Prompt::Text(t)) => Ok((prepare::encode(state, &t, true, "prompt").await?, Some(t))),
        Some(Prompt::Ids(ids)) => Ok((ids, None)),
        Some(Prompt::Texts(mut v)) if v.len() == 1 => {
            let t = v.pop().expect("len 1");
            Ok((prepare::encode(state, &t, true, "prompt").await?, Some(t)))
        }
        Some(Prompt::IdBatch(mut v)) if v.len() == 1 => Ok((v.pop().expect("len 1"), None)),
        Some(_) => Err(batch()),
    }
}

struct CompletionChunks {
    id: String,
    model: String,
    created: u64,
    include_usage: bool,
    /// The prompt text every choice starts with (`echo`).
    echo: Option<String>,
    /// With echo and logprobs: the prompt's ids; the echo then goes out with the first piece,
    /// which carries the prompt's logprobs (they come with the first token).
    echo_ids: Option<Vec<u32>>,
    /// One per choice when the request asked for logprobs (the tokenizer names tokens).
    logprobs: Option<Vec<CompletionLogprobs>>,
    files: Option<Arc<ModelFiles>>,
}

impl CompletionChunks {
    fn chunk(&self, index: usize, text: &str, finish: Option<&str>, logprobs: Value) -> Value {
        json!({"id": self.id, "object": "text_completion", "created": self.created,
               "model": self.model,
               "choices": [{"index": index, "text": text, "logprobs": logprobs,
                            "finish_reason": finish}]})
    }

    /// Choice `index`'s `logprobs` for these tokens (null when the request did not ask),
    /// after the echoed prompt's when `prompt` is given.
    fn logprobs(
        &mut self,
        index: usize,
        prompt: Option<&[TokenLogprob]>,
        ids: &[u32],
        lps: &[TokenLogprob],
    ) -> Value {
        match self.logprobs.as_mut() {
            None => Value::Null,
            Some(all) => {
                if let (Some(p), Some(echo)) = (prompt, self.echo_ids.as_deref()) {
                    all[index].push_prompt(self.files.as_deref(), echo, p);
                }
                all[index].push(self.files.as_deref(), ids, lps);
                all[index].take()
            }
        }
    }
}

impl ChunkFormat for CompletionChunks {
    fn start(&mut self, index: usize, _ts: &TextStream) -> Vec<Value> {
        match &self.echo {
            Some(t) if !t.is_empty() && self.echo_ids.is_none() => {
                vec![self.chunk(index, t, None, Value::Null)]
            }
            _ => Vec::new(),
        }
    }

    fn piece(&mut self, index: usize, ts: &TextStream, p: &Piece) -> Vec<Value> {
        // NOTE: with echo and logprobs the first piece of each choice carries the prompt.
        let first = self.echo_ids.is_some() && ts.completion_tokens == p.ids.len();
        if !first && p.text.is_empty() && p.finish.is_none() && p.logprobs.is_empty() {
            return Vec::new();
        }
        let prompt = first.then(|| ts.prompt_logprobs.as_deref().unwrap_or_default());
        let lps = self.logprobs(index, prompt, &p.ids, &p.logprobs);
        let text = match (first, &self.echo) {
            (true, Some(echo)) => format!("{echo}{}", p.text),
            _ => p.text.clone(),
        };
        vec![self.chunk(index, &text, p.finish, lps)]
    }

    fn end(&mut self, all: &[TextStream]) -> Vec<Value> {
        let (id, model) = (&self.id, &self.model);
        sse::usage_chunk(
            self.include_usage,
            id,
            "text_completion",
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
    let req: CompletionRequest = parse_body(&body)?;
    let (tier, n) = prepare::openai_common(&state, &headers, &req.common)?;
    let mut sampling = SamplingInput::from_common(&req.common);
    // OpenAI's default for /v1/completions is 16 tokens.
    sampling.default_max_tokens = Some(16);
    sampling.logprobs = logprobs::completion_request(&req.common)?;
    sampling.grammar = structured_only(&req.common)?;
    // OpenAI's echo with logprobs reports the prompt's tokens too (lm-evaluation-harness
    // scores continuations this way).
    sampling.prompt_logprobs = sampling.logprobs.filter(|_| req.echo);
    let replies = fields::apply(&state, &req.common, &mut sampling).await?;
    if replies.tokens_as_ids {
        return Err(ApiError::invalid(
            "return_tokens_as_token_ids",
            "return_tokens_as_token_ids is supported by /v1/chat/completions only",
        ));
    }
    let (ids, text) = prompt_ids(&state, req.prompt).await?;
    let ids = fields::truncate(&state, &req.common, ids);
    let prompt_ids = ids.clone();
    let echo_ids = sampling.prompt_logprobs.map(|_| ids.clone());
    // NOTE: after `echo_ids`: the echo's logprobs follow `echo`, not `prompt_logprobs`.
    fields::want_prompt_logprobs(&mut sampling, &replies);
    let echo = if req.echo {
        Some(match (text, state.model.as_deref()) {
            (Some(t), _) => t,
            (None, Some(m)) => crate::tokenize::Decode::decode(m, &ids),
            (None, None) => String::new(),
        })
    } else {
        None
    };
    let stops = req.common.stop_strings();
    let mut all = prepare::start_choices(&state, tier, ids, "prompt", &sampling, stops, n)?;
    replies.log(&all);
    let mut fmt = CompletionChunks {
        id: replies.response_id("cmpl-", all[0].id),
        model: state.served_model().to_string(),
        created: unix_now(),
        include_usage: req.common.include_usage(),
        logprobs: sampling
            .logprobs
            .map(|_| (0..n).map(|_| CompletionLogprobs::default()).collect()),
        echo,
        echo_ids,
        files: state.model.clone(),
    };
    if req.common.stream {
        return Ok(sse::respond(
            all,
            super::fields_stream::Shaped::new(fmt, replies),
        ));
    }
    let outs = try_join_all(all.iter_mut().map(TextStream::collect)).await?;
    let echo = fmt.echo.clone().unwrap_or_default();
    let choices: Vec<Value> = outs
        .iter()
        .zip(&all)
        .enumerate()
        .map(|(index, ((text, ids, finish), ts))| {
            let prompt = ts.prompt_logprobs.as_deref().or(Some(&[]));
            let lps = fmt.logprobs(index, prompt, ids, &ts.logprobs);
            json!({"index": index, "text": echo.clone() + text, "logprobs": lps,
                   "finish_reason": finish})
        })
        .collect();
    let mut body = json!({
        "id": fmt.id, "object": "text_completion", "created": fmt.created, "model": fmt.model,
        "choices": choices,
        "usage": output::usage(&all),
    });
    let choice_ids: Vec<&[u32]> = outs.iter().map(|(_, ids, _)| ids.as_slice()).collect();
    replies.finish_body(
        &mut body,
        &prompt_ids,
        &all,
        &choice_ids,
        state.model.as_deref(),
    );
    Ok(axum::Json(body).into_response())
}

/// `response_format`'s grammar; `tools` (a chat feature: calls need a chat template) refused.
fn structured_only(
    c: &crate::protocols::openai::CommonParams,
) -> Result<Option<crate::protocols::structured::Grammar>, ApiError> {
    use crate::protocols::{structured, tools};
    let tools = tools::parse(c.tools.as_ref(), c.tool_choice.as_ref())
        .map_err(|(field, why)| ApiError::invalid(field, why))?;
    if tools.is_some() {
        return Err(ApiError::invalid(
            "tools",
            "tools are supported by /v1/chat/completions only",
        ));
    }
    structured::response_format(c.response_format.as_ref())
        .map_err(|why| ApiError::invalid(structured::FIELD, why))
}
