//! `/v1/models`, `/v1/models/{id}`, `/version`, `/health`, `/metrics` (Prometheus text) and
//! `/admin/plan`.

use std::collections::HashMap;
use std::fmt::Write;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::{unix_now, AppState};
use crate::errors::ApiError;
use crate::metrics::binding::render_bind_decisions;
use crate::metrics::engine::EngineGauges;

/// The longest context the deployment serves: the model's window, capped by the most any live
/// worker holds (a worker whose largest TP group's KV holds less says so in `register`).
pub fn max_model_len(state: &AppState) -> Option<u64> {
    let window = state.model.as_ref().map(|m| m.max_context as u64);
    match (window, state.router.worker_max_context()) {
        (Some(w), Some(c)) => Some(w.min(c)),
        (w, c) => w.or(c),
    }
}

/// Where the served model was loaded from (`--model-dir`), else its served name.
pub fn model_path(state: &AppState) -> String {
    match &state.router.cfg.model_dir {
        Some(dir) => dir.display().to_string(),
        None => state.served_model().to_string(),
    }
}

/// The served model under name `id` as an OpenAI model object (with vLLM's `max_model_len`).
fn model_card(state: &AppState, id: &str) -> serde_json::Value {
    json!({
        "id": id, "object": "model", "created": unix_now(),
        "owned_by": "nitsum",
        // vLLM's: the model the name serves (its path), and the base of an adapter (none).
        "root": model_path(state),
        "parent": null,
        "max_model_len": max_model_len(state),
    })
}

/// `GET /v1/models`: the one served model, once per name it answers to.
pub async fn models(State(state): State<Arc<AppState>>) -> Response {
    let data: Vec<_> = state.model_names().map(|n| model_card(&state, n)).collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

/// `GET /v1/models/{id}`: the served model, 404 for any other id.
pub async fn model(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    if !state.serves_model(&id) {
        return ApiError::model_not_found(&id).into_response();
    }
    axum::Json(model_card(&state, &id)).into_response()
}

/// `GET /version`: the server's version (vLLM's and SGLang's endpoint).
pub async fn version() -> Response {
    axum::Json(json!({"version": env!("CARGO_PKG_VERSION"), "server": "nitsum"})).into_response()
}

/// `GET /health`: 200 when at least one worker is registered, else 503.
pub async fn health(State(state): State<Arc<AppState>>) -> Response {
    let workers = state.router.workers().len();
    let epoch = state.router.plan().epoch;
    let status = if workers > 0 {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let word = if workers > 0 {
        crate::health()
    } else {
        "no_workers"
    };
    (
        status,
        axum::Json(json!({"status": word, "workers": workers, "plan_epoch": epoch})),
    )
        .into_response()
}

/// `GET /admin/plan`: the current plan as JSON (read-only), the control loop's recent
/// decisions in `history` (oldest first), whether a round is waiting for acks, and per worker
/// its per-request TP bindings (`binding`: counters and last decision, null if unreported).
pub async fn admin_plan(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(e) = state.auth.require_admin(&headers) {
        return e.into_response();
    }
    let tiers = &state.router.cfg.tiers;
    let plan = state.router.plan().named(tiers);
    let history: Vec<_> = state
        .router
        .plan_history()
        .iter()
        .map(|r| r.named(tiers))
        .collect();
    // NOTE: a host worker sends one `stats` for all its devices, on its first one's link:
    // the other devices' `binding` is null.
    let stats: HashMap<_, _> = state.router.worker_stats().into_iter().collect();
    let workers: Vec<_> = state
        .router
        .workers()
        .into_iter()
        .map(|(id, w)| {
            let binding = stats.get(&id).and_then(|s| s.binding());
            json!({"id": id, "device": w.device, "model": w.model, "tp_levels": w.tp_levels,
                   "binding": binding})
        })
        .collect();
    axum::Json(
        json!({"epoch": plan.epoch, "groups": plan.groups, "workers": workers,
        "control": state.router.cfg.profile.is_some(),
        "pending": state.router.round_pending(),
        "strategy": state.router.last_choice(),
        "router": router_role(&state.router),
        "history": history}),
    )
    .into_response()
}

/// This router's part among several (architecture §4): its index, role, the leader and
/// term it knows, the followers it hears from (as leader, seconds since), the control
/// windows it planned (and when the latest were, unix ms), since when it leads, and each
/// worker's plan epoch as reported.
fn router_role(router: &crate::state::RouterState) -> serde_json::Value {
    use crate::state::RouterRole as Role;
    let (role, term, leader) = match router.role() {
        Role::Alone => ("alone", None, None),
        Role::Leader { term } => ("leader", Some(term), None),
        Role::Follower { leader } => ("follower", leader.as_ref().map(|l| l.term), leader),
    };
    let (windows, planned_at) = router.planned_windows();
    let epochs: HashMap<String, u64> = router
        .worker_epochs()
        .into_iter()
        .map(|(w, e)| (w.0.to_string(), e))
        .collect();
    json!({"index": router.cfg.router_index, "role": role, "term": term, "leader": leader,
           "followers": router.followers(), "windows_planned": windows,
           "planned_unix_ms": planned_at, "leading_since_ms": router.leading_since_ms(),
           "worker_epochs": epochs})
}

/// `GET /metrics`: Prometheus text exposition.
pub async fn metrics(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if state.router.cfg.restrict_metrics {
        if let Err(e) = state.auth.require_admin(&headers) {
            return e.into_response();
        }
    }
    let mut out = String::with_capacity(16 * 1024);
    state.router.metrics.render(&mut out);
    render_gauges(&state, &mut out);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}

fn gauge(out: &mut String, name: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
}

fn render_gauges(state: &AppState, out: &mut String) {
    let e = &state.router;
    gauge(out, "nitsum_plan_epoch", "Epoch of the current plan.");
    let _ = writeln!(out, "nitsum_plan_epoch {}", e.plan().epoch);
    gauge(
        out,
        "nitsum_workers_alive",
        "Registered workers with recent heartbeats.",
    );
    let _ = writeln!(out, "nitsum_workers_alive {}", e.workers().len());
    gauge(
        out,
        "nitsum_requests_inflight",
        "Requests dispatched and not finished.",
    );
    let _ = writeln!(out, "nitsum_requests_inflight {}", e.inflight());
    let groups = e.groups();
    let series: [(&str, &str); 4] = [
        (
            "nitsum_group_tp",
            "TP level of each group (labelled by leader and role).",
        ),
        (
            "nitsum_group_assigned",
            "Unfinished requests the dispatcher charged to each group.",
        ),
        (
            "nitsum_group_running",
            "Running requests reported by the group's workers.",
        ),
        (
            "nitsum_group_waiting",
            "Queued requests reported by the group's workers.",
        ),
    ];
    for (i, (name, help)) in series.iter().enumerate() {
        gauge(out, name, help);
        for g in &groups {
            let v = [
                u64::from(g.group.tp),
                u64::from(g.assigned),
                g.running,
                g.waiting,
            ][i];
            let role = serde_json::to_value(g.group.role).unwrap_or_default();
            let role = role.as_str().unwrap_or("");
            let _ = writeln!(
                out,
                "{name}{{group=\"{}\",role=\"{role}\"}} {v}",
                g.group.leader()
            );
        }
    }
    let stats = e.worker_stats();
    let (running, waiting) = groups
        .iter()
        .fold((0, 0), |(r, w), g| (r + g.running, w + g.waiting));
    let mut engine = EngineGauges::of(running, waiting, &stats);
    engine.admission_rejections = e
        .metrics
        .tiers
        .iter()
        .map(|(_, t)| t.rejected.load(std::sync::atomic::Ordering::Relaxed) as f64)
        .sum();
    engine.kv_tokens = e.workers().iter().map(|(_, w)| w.kv_capacity_tokens).sum();
    e.metrics.vllm.render(out, &engine);
    e.metrics.vllm.render_sglang(out, &engine);
    render_bind_decisions(out, &stats);
    if stats.iter().any(|(_, s)| !s.fields().is_empty()) {
        gauge(
            out,
            "nitsum_worker_stat",
            "Fields of the workers' `stats` messages.",
        );
        for (w, s) in &stats {
            for (k, v) in s.fields() {
                let _ = writeln!(out, "nitsum_worker_stat{{worker=\"{w}\",name=\"{k}\"}} {v}");
            }
        }
    }
}
