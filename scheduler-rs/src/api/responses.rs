//! `POST /v1/responses` (OpenAI's Responses API), non-streamed and streamed: a translation
//! layer onto the chat pipeline. The request becomes a chat completion request
//! (protocols/responses.rs), runs through `chat::start`, and its reply becomes a response
//! object (api/response_object.rs) or its event stream (api/responses_stream.rs). Errors name
//! the Responses field (`text.format`, `max_output_tokens`, `input`).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value};

use super::chat::{self, Started};
use super::response_object::{self as obj, ResponseMeta};
use super::responses_stream::ResponseEvents;
use super::{sse, unix_now, AppState};
use crate::errors::ApiError;
use crate::protocols::body::parse_body;
use crate::protocols::openai::ChatCompletionRequest;
use crate::protocols::responses;

/// Handler.
pub async fn handle(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    run(state, headers, body).await.map_err(rename)
}

/// An error of the chat pipeline, naming the Responses field.
fn rename(mut e: ApiError) -> ApiError {
    e.param = e.param.as_deref().map(responses::field_name);
    e
}

async fn run(state: Arc<AppState>, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    let request: Map<String, Value> = parse_body(&body)?;
    let chat_body = responses::to_chat(&request).map_err(|(f, why)| ApiError::invalid(&f, why))?;
    let bytes = serde_json::to_vec(&chat_body).map_err(|e| ApiError::internal(e.to_string()))?;
    let req: ChatCompletionRequest = parse_body(&bytes)?;
    let Started {
        mut all, reading, ..
    } = chat::start(&state, &headers, &req).await?;
    let meta = ResponseMeta::new(&request, all[0].id, unix_now(), state.served_model());
    if req.common.stream {
        return Ok(sse::respond(all, ResponseEvents::new(meta, reading)));
    }
    let (text, _, finish) = all[0].collect().await?;
    let output = obj::output_items(&meta, &reading, &text, finish);
    let response = meta.object(obj::status(finish), &output, obj::usage(&all));
    Ok(axum::Json(response).into_response())
}
