//! HTTP API (axum): OpenAI-compatible endpoints, the native `/generate`, health, metrics and
//! admin. One file per concern; `prepare` turns request fields into a validated `Submit`,
//! `output` turns engine events into text with detokenization and stop strings.

mod chat;
mod completions;
mod misc;
mod native;
pub mod output;
pub mod prepare;
mod sse;

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::routing::{get, post};
use axum::Router;

use crate::auth::Auth;
use crate::engine::Engine;
use crate::tokenize::ModelFiles;

/// Shared state of every handler.
pub struct AppState {
    pub engine: Arc<Engine>,
    /// `None` without `--model-dir`: only token-id requests work then.
    pub model: Option<Arc<ModelFiles>>,
    pub auth: Auth,
}

impl AppState {
    pub fn new(engine: Arc<Engine>, model: Option<Arc<ModelFiles>>) -> Arc<Self> {
        let auth = Auth::new(engine.cfg.api_keys.clone(), engine.cfg.tiers.clone());
        Arc::new(AppState {
            engine,
            model,
            auth,
        })
    }

    pub fn served_model(&self) -> &str {
        &self.engine.cfg.served_model_name
    }
}

/// The axum router with every endpoint.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat::handle))
        .route("/v1/completions", post(completions::handle))
        .route("/v1/models", get(misc::models))
        .route("/generate", post(native::handle))
        .route("/health", get(misc::health))
        .route("/metrics", get(misc::metrics))
        .route("/admin/plan", get(misc::admin_plan))
        .with_state(state)
}

/// Seconds since the Unix epoch (`created` fields).
pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
