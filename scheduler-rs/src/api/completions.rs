//! `POST /v1/completions`: `prompt` is text or a list of token ids.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::output::{Piece, TextStream};
use super::prepare::{self, SamplingInput};
use super::sse::{self, ChunkFormat};
use super::{unix_now, AppState};
use crate::errors::ApiError;
use crate::protocols::openai::{parse_body, CompletionRequest, Prompt};

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
    echo: Option<String>,
}

impl CompletionChunks {
    fn chunk(&self, text: &str, finish: Option<&str>) -> Value {
        json!({"id": self.id, "object": "text_completion", "created": self.created,
               "model": self.model,
               "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": finish}]})
    }
}

impl ChunkFormat for CompletionChunks {
    fn start(&mut self, _ts: &TextStream) -> Vec<Value> {
        match self.echo.take() {
            Some(t) if !t.is_empty() => vec![self.chunk(&t, None)],
            _ => Vec::new(),
        }
    }

    fn piece(&mut self, _ts: &TextStream, p: &Piece) -> Vec<Value> {
        if p.text.is_empty() && p.finish.is_none() {
            return Vec::new();
        }
        vec![self.chunk(&p.text, p.finish)]
    }

    fn end(&mut self, ts: &TextStream) -> Vec<Value> {
        let (id, model) = (&self.id, &self.model);
        sse::usage_chunk(
            self.include_usage,
            id,
            "text_completion",
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
    let req: CompletionRequest = parse_body(&body)?;
    let tier = prepare::openai_common(&state, &headers, &req.common)?;
    let (ids, text) = prompt_ids(&state, req.prompt).await?;
    let echo = if req.echo {
        Some(match (text, state.model.as_deref()) {
            (Some(t), _) => t,
            (None, Some(m)) => crate::tokenize::Decode::decode(m, &ids),
            (None, None) => String::new(),
        })
    } else {
        None
    };
    let mut sampling = SamplingInput::from_common(&req.common);
    // OpenAI's default for /v1/completions is 16 tokens.
    sampling.default_max_tokens = Some(16);
    sampling.grammar = structured_only(&req.common)?;
    let stops = req.common.stop_strings();
    let mut ts = prepare::start(&state, tier, ids, "prompt", &sampling, stops)?;
    let mut fmt = CompletionChunks {
        id: format!("cmpl-{}", ts.id),
        model: state.served_model().to_string(),
        created: unix_now(),
        include_usage: req.common.include_usage(),
        echo,
    };
    if req.common.stream {
        return Ok(sse::respond(ts, fmt));
    }
    let (text, _ids, finish) = ts.collect().await?;
    let text = fmt.echo.take().unwrap_or_default() + &text;
    Ok(axum::Json(json!({
        "id": fmt.id, "object": "text_completion", "created": fmt.created, "model": fmt.model,
        "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": finish}],
        "usage": ts.usage(),
    }))
    .into_response())
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
