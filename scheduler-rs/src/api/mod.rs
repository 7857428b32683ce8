//! HTTP API (axum): OpenAI-compatible endpoints, the native `/generate`, health, metrics and
//! admin. One file per concern; `prepare` turns request fields into a validated `Submit`,
//! `output` turns engine events into text with detokenization and stop strings.

mod answer;
mod chat;
mod chat_render;
mod choices;
mod completion_chunks;
mod completions;
mod fields;
mod fields_stream;
pub mod listen;
mod logprobs;
mod misc;
mod native_generate;
mod native_input;
mod openapi;
pub mod output;
pub mod prepare;
mod quota;
mod reading;
mod reasoning_reply;
mod response_object;
mod responses;
mod responses_stream;
mod sse;
pub mod tls;
mod tokenize_routes;
mod tool_reply;
mod utility;

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::routing::{get, post};
use axum::Router;

use crate::auth::Auth;
use crate::state::RouterState;
use crate::tokenize::ModelFiles;

/// Shared state of every handler.
pub struct AppState {
    pub router: Arc<RouterState>,
    /// `None` without `--model-dir`: only token-id requests work then.
    pub model: Option<Arc<ModelFiles>>,
    pub auth: Auth,
    /// Per-key quotas, indexed as `auth.keys()`.
    pub quotas: quota::Quotas,
}

impl AppState {
    pub fn new(router: Arc<RouterState>, model: Option<Arc<ModelFiles>>) -> Arc<Self> {
        let auth = Auth::new(router.cfg.api_keys.clone(), router.cfg.tiers.clone());
        let quotas = quota::Quotas::new(auth.keys());
        Arc::new(AppState {
            router,
            model,
            auth,
            quotas,
        })
    }

    pub fn served_model(&self) -> &str {
        &self.router.cfg.served_model_name
    }

    /// Every name the model answers to: the served name first, then its aliases.
    pub fn model_names(&self) -> impl Iterator<Item = &str> {
        let cfg = &self.router.cfg;
        std::iter::once(cfg.served_model_name.as_str())
            .chain(cfg.model_aliases.iter().map(String::as_str))
    }

    /// Whether `model` is one of the names the model answers to.
    pub fn serves_model(&self, model: &str) -> bool {
        self.model_names().any(|n| n == model)
    }

    /// Per-request deadline (zero: none).
    pub fn request_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.router.cfg.request_timeout_ms)
    }
}

/// The axum router with every endpoint.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat::handle))
        .route("/v1/completions", post(completions::handle))
        .route("/v1/responses", post(responses::handle))
        .route("/v1/models", get(misc::models))
        .route("/v1/models/{id}", get(misc::model))
        .route("/tokenize", post(tokenize_routes::tokenize))
        .route("/detokenize", post(tokenize_routes::detokenize))
        .route("/tokenizer_info", get(tokenize_routes::tokenizer_info))
        .route("/version", get(misc::version))
        .route("/generate", post(native_generate::handle))
        .route("/health", get(misc::health))
        .route("/metrics", get(misc::metrics))
        .route("/admin/plan", get(misc::admin_plan))
        .route("/ping", get(utility::ping).post(utility::ping))
        .route("/load", get(utility::load))
        .route("/flush_cache", post(utility::flush_cache))
        .route("/reset_prefix_cache", post(utility::flush_cache))
        .route("/get_model_info", get(utility::model_info))
        .route("/server_info", get(utility::server_info))
        .route("/get_server_info", get(utility::server_info))
        .route(
            "/health_generate",
            get(utility::health_generate).post(utility::health_generate),
        )
        .route("/openapi.json", get(openapi::openapi_json))
        .route("/docs", get(openapi::docs))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            listen::read_body_within,
        ))
        // NOTE: outside the body read: a key over its quota is refused before its body is.
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            quota::enforce,
        ))
        .with_state(state)
        .layer(axum::middleware::map_response(openai_errors))
}

/// NOTE: every error leaves in the OpenAI shape, also those axum answers before a handler
/// runs (404 unknown path, 405 wrong method, 413 body over the limit, 415...): clients parse
/// `error.message` whatever the status.
async fn openai_errors(resp: axum::response::Response) -> axum::response::Response {
    use axum::response::IntoResponse;
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if is_json || !(status.is_client_error() || status.is_server_error()) {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let text = axum::body::to_bytes(body, 4096)
        .await
        .ok()
        .and_then(|b| String::from_utf8(b.to_vec()).ok())
        .filter(|t| !t.trim().is_empty())
        .unwrap_or_else(|| status.canonical_reason().unwrap_or("error").to_string());
    let mut out = crate::errors::ApiError::from_status(status, text).into_response();
    for name in [axum::http::header::ALLOW, axum::http::header::RETRY_AFTER] {
        if let Some(v) = parts.headers.get(&name) {
            out.headers_mut().insert(name, v.clone());
        }
    }
    out
}

/// Seconds since the Unix epoch (`created` fields).
pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
