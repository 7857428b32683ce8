//! The utility endpoints vLLM's and SGLang's clients call besides generation: `/ping` and
//! `/load` (vLLM), `/get_model_info`, `/server_info` and `/health_generate` (SGLang; the
//! `sgl.RuntimeEndpoint` frontend reads `/get_model_info` when it connects), and the prefix
//! cache resets `/flush_cache` (SGLang) and `/reset_prefix_cache` (vLLM).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::choices;
use super::misc::{self, max_model_len, model_path};
use super::prepare::{self, SamplingInput};
use super::AppState;
use crate::errors::ApiError;
use crate::protocols::sampling_fields::SamplingFields;

/// How long `/health_generate`'s one-token generation may take before it reports failure.
const HEALTH_GENERATE_TIMEOUT: Duration = Duration::from_secs(20);

/// `GET|POST /ping`: vLLM's health check (SageMaker's path), the same answer as `/health`.
pub async fn ping(state: State<Arc<AppState>>) -> Response {
    misc::health(state).await
}

/// `GET /load`: vLLM's `{"server_load": N}`, the requests the server holds (dispatched and
/// not finished), for load-aware proxies.
pub async fn load(State(state): State<Arc<AppState>>) -> Response {
    axum::Json(json!({"server_load": state.router.inflight()})).into_response()
}

/// `GET /get_model_info`: SGLang's model description.
pub async fn model_info(State(state): State<Arc<AppState>>) -> Response {
    let path = model_path(&state);
    axum::Json(json!({
        "model_path": path,
        "tokenizer_path": state.model.as_ref().map(|_| path.clone()),
        "served_model_name": state.served_model(),
        "is_generation": true,
        "preferred_sampling_params": null,
        "weight_version": "default",
        "has_image_understanding": false,
        "has_audio_understanding": false,
        "max_model_len": max_model_len(&state),
    }))
    .into_response()
}

/// `GET /server_info` (SGLang's; also `/get_server_info`): the configuration a client may
/// size its requests by, and the live state SGLang reports in `internal_states`.
pub async fn server_info(State(state): State<Arc<AppState>>) -> Response {
    let cfg = &state.router.cfg;
    let tiers: Vec<_> = cfg.tiers.iter().map(|t| t.name.clone()).collect();
    axum::Json(json!({
        "version": env!("CARGO_PKG_VERSION"),
        "server": "nitsum",
        "model_path": model_path(&state),
        "served_model_name": state.served_model(),
        "context_length": max_model_len(&state),
        "max_batch_prompts": cfg.max_batch_prompts,
        "request_timeout_ms": cfg.request_timeout_ms,
        "tiers": tiers,
        "internal_states": [{
            "workers": state.router.workers().len(),
            "plan_epoch": state.router.plan().epoch,
            "requests_inflight": state.router.inflight(),
        }],
    }))
    .into_response()
}

/// `POST /flush_cache` (SGLang) and `POST /reset_prefix_cache` (vLLM): every live worker
/// drops its prefix caches' pages that no running request holds (running requests keep
/// theirs). Admin only, as vLLM's dev-mode endpoints. The workers are told, not waited for:
/// `{"workers": N}` says how many were told.
pub async fn flush_cache(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(e) = state.auth.require_admin(&headers) {
        return e.into_response();
    }
    let workers = state.router.flush_prefix_caches();
    axum::Json(json!({"workers": workers})).into_response()
}

/// `GET|POST /health_generate`: SGLang's deep health check: a one-token generation through
/// a worker. 200 when it produced its token, 503 (with why) when it did not within
/// `HEALTH_GENERATE_TIMEOUT`. Authenticated like a generation (it uses a worker).
pub async fn health_generate(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let tier = prepare::tier(&state, &headers, None)?;
    if state.router.workers().is_empty() {
        return Err(ApiError::unavailable("no worker is registered"));
    }
    let sampling = SamplingInput {
        max_tokens: Some(1),
        max_tokens_field: "max_new_tokens",
        knobs: SamplingFields {
            temperature: Some(0.0),
            ..SamplingFields::default()
        },
        ignore_eos: true,
        ..SamplingInput::default()
    };
    // NOTE: token 0 exists in every vocabulary; the prompt's content does not matter.
    let mut ts =
        choices::start(&state, tier, vec![0], "input_ids", &sampling, Vec::new(), 1)?.remove(0);
    match tokio::time::timeout(HEALTH_GENERATE_TIMEOUT, ts.collect()).await {
        Ok(Ok((_, ids, _))) if !ids.is_empty() => Ok(StatusCode::OK.into_response()),
        Ok(Ok(_)) => Err(ApiError::unavailable("the generation produced no token")),
        Ok(Err(e)) => Err(ApiError::unavailable(format!(
            "generation failed: {}",
            e.message
        ))),
        Err(_) => Err(ApiError::unavailable(format!(
            "no token within {} s",
            HEALTH_GENERATE_TIMEOUT.as_secs()
        ))),
    }
}
