//! The answer of a chat or text completion, once its choices were submitted: their chunks as
//! SSE (with what vLLM's fields add to each, fields_stream.rs), or every choice collected into
//! one body (with what the fields add to it, `Replies::finish_body`).

use axum::response::{IntoResponse, Response};
use futures_util::future::try_join_all;
use serde_json::{json, Value};

use super::fields::Replies;
use super::fields_stream::Shaped;
use super::output::TextStream;
use super::sse::{self, ChunkFormat};
use super::AppState;
use crate::errors::ApiError;

/// A choice's whole output: its text, its token ids and its finish reason.
pub type Collected = (String, Vec<u32>, &'static str);

/// A completion endpoint's response format: its chunks when streamed, and the parts of its
/// whole body when not (the body's `id`, `created` and `model` are the chunks').
pub trait WholeBody: ChunkFormat {
    /// The body's `object` (`chat.completion`, `text_completion`).
    const OBJECT: &'static str;
    /// The response's (`id`, `created`, `model`).
    fn head(&self) -> (&str, u64, &str);
    /// The whole choice `index`.
    fn choice(&mut self, index: usize, out: &Collected, ts: &TextStream) -> Value;
    /// The body's `usage`.
    fn usage(&self, all: &[TextStream]) -> Value;
}

/// Stream `all` as `fmt` formats them (`stream`), or wait for every choice and answer one
/// JSON body; `prompt_ids` is the (first) prompt the fields may echo.
pub async fn respond<F: WholeBody>(
    state: &AppState,
    mut all: Vec<TextStream>,
    stream: bool,
    mut fmt: F,
    replies: Replies,
    prompt_ids: &[u32],
) -> Result<Response, ApiError> {
    if stream {
        return Ok(sse::respond(all, Shaped::new(fmt, replies)));
    }
    let outs = try_join_all(all.iter_mut().map(TextStream::collect)).await?;
    let choices: Vec<Value> = outs
        .iter()
        .zip(&all)
        .enumerate()
        .map(|(index, (out, ts))| fmt.choice(index, out, ts))
        .collect();
    let (id, created, model) = fmt.head();
    let mut body = json!({
        "id": id, "object": F::OBJECT, "created": created, "model": model,
        "choices": choices,
        "usage": fmt.usage(&all),
    });
    let choice_ids: Vec<&[u32]> = outs.iter().map(|(_, ids, _)| ids.as_slice()).collect();
    replies.finish_body(
        &mut body,
        prompt_ids,
        &all,
        &choice_ids,
        state.model.as_deref(),
    );
    Ok(axum::Json(body).into_response())
}
