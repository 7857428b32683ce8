//! `POST /tokenize` and `POST /detokenize`, as vLLM and SGLang serve them: scripts count a
//! prompt's tokens (or render a chat) with the server's own tokenizer and template.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::chat::render;
use super::misc::max_model_len;
use super::prepare;
use super::AppState;
use crate::errors::ApiError;
use crate::protocols::body::parse_body;
use crate::protocols::openai::ChatMessage;
use crate::tokenize::detok::Decode;

/// `POST /tokenize`: a `prompt`, or chat `messages` rendered with the chat template.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct TokenizeRequest {
    model: Option<String>,
    prompt: Option<String>,
    messages: Option<Vec<ChatMessage>>,
    /// For `prompt`: add BOS etc. as a completion would (default true, as vLLM).
    add_special_tokens: Option<bool>,
    /// For `messages`: only the value a chat completion uses is supported.
    add_generation_prompt: Option<bool>,
    /// vLLM's: also the tokenizer's string of each token (`token_strs`).
    #[serde(default)]
    return_token_strs: bool,
}

/// `POST /detokenize`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct DetokenizeRequest {
    model: Option<String>,
    tokens: Option<Vec<u32>>,
}

/// `model` is optional here (vLLM's convention for these two endpoints), but checked if sent.
fn check_model_if_sent(state: &AppState, model: Option<&str>) -> Result<(), ApiError> {
    model.map_or(Ok(()), |m| prepare::check_model(state, Some(m)))
}

/// Handler of `/tokenize`: `{"tokens", "count", "max_model_len"}`.
pub async fn tokenize(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    prepare::tier(&state, &headers, None)?; // authentication, as every generation endpoint
    let req: TokenizeRequest = parse_body(&body)?;
    check_model_if_sent(&state, req.model.as_deref())?;
    let tokens = match (req.prompt, req.messages) {
        (Some(prompt), None) => {
            let special = req.add_special_tokens.unwrap_or(true);
            prepare::encode(&state, &prompt, special, "prompt").await?
        }
        (None, Some(messages)) => {
            if req.add_generation_prompt == Some(false) {
                return Err(ApiError::invalid(
                    "add_generation_prompt",
                    crate::protocols::extensions::not_supported("add_generation_prompt: false"),
                ));
            }
            // NOTE: as a chat completion tokenizes it: the template inserts BOS itself.
            let text = render(&state, &messages, None)?;
            prepare::encode(&state, &text, false, "messages").await?
        }
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "messages",
                "send `prompt` or `messages`, not both",
            ))
        }
        (None, None) => return Err(ApiError::invalid("prompt", "send `prompt` or `messages`")),
    };
    // NOTE: vLLM sends `token_strs: null` unless asked.
    let token_strs = match (req.return_token_strs, state.model.as_deref()) {
        (true, Some(m)) => json!(m.token_strs(&tokens)),
        _ => serde_json::Value::Null,
    };
    Ok(axum::Json(json!({
        "tokens": tokens,
        "count": tokens.len(),
        "max_model_len": max_model_len(&state),
        "token_strs": token_strs,
    }))
    .into_response())
}

/// Handler of `/detokenize`: `{"prompt": text}` (vLLM's key) and `"text"` (SGLang's).
pub async fn detokenize(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    prepare::tier(&state, &headers, None)?;
    let req: DetokenizeRequest = parse_body(&body)?;
    check_model_if_sent(&state, req.model.as_deref())?;
    let tokens = req
        .tokens
        .ok_or_else(|| ApiError::invalid("tokens", "send `tokens`: a list of token ids"))?;
    let model = state
        .model
        .clone()
        .ok_or_else(|| ApiError::invalid("tokens", "this router has no tokenizer"))?;
    let vocab = model.vocab_size();
    if let Some(bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::invalid(
            "tokens",
            format!("token id {bad} is outside the vocabulary (size {vocab})"),
        ));
    }
    let text = tokio::task::spawn_blocking(move || Decode::decode(&*model, &tokens))
        .await
        .map_err(|e| ApiError::internal(format!("tokenizer task failed: {e}")))?;
    Ok(axum::Json(json!({"prompt": text, "text": text})).into_response())
}

/// Handler of `GET /tokenizer_info` (vLLM's): the tokenizer's configuration, its class and the
/// chat template (tokenize/info.rs). lm-evaluation-harness's remote tokenizer starts with it.
pub async fn tokenizer_info(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    prepare::tier(&state, &headers, None)?;
    let model = state.model.as_deref().ok_or_else(|| {
        ApiError::from_status(
            axum::http::StatusCode::NOT_FOUND,
            "this router has no tokenizer (start it with --model-dir)".to_string(),
        )
    })?;
    Ok(axum::Json(model.info.clone()).into_response())
}
