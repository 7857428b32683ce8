//! Why the router did not admit a request, and the HTTP answer each reason gets.

use axum::http::StatusCode;

use crate::errors::ApiError;

/// Why a request was not admitted.
#[derive(Debug, Clone, PartialEq)]
pub enum SubmitError {
    /// No group can take it now (503).
    NoWorker,
    /// Its tier already holds `limit` requests (`Tier::max_inflight`; 429).
    TierFull { tier: String, limit: u32 },
    /// The router is shutting down (503).
    Draining,
    /// The plan has no SLO bandwidth left for it and its tier refuses best effort
    /// (`Tier::reject_unattainable`; 429).
    Unattainable { tier: String },
}

impl std::fmt::Display for SubmitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SubmitError::NoWorker => f.write_str("no worker available for this request"),
            SubmitError::Draining => f.write_str("the server is shutting down"),
            SubmitError::TierFull { tier, limit } => {
                write!(f, "tier `{tier}` already has {limit} requests in flight")
            }
            SubmitError::Unattainable { tier } => write!(
                f,
                "tier `{tier}` has no capacity left that meets its SLO; retry later"
            ),
        }
    }
}

/// NOTE: here rather than in `errors.rs`, so the API error type (used by the wire protocols
/// below the router state) never imports the state.
impl From<SubmitError> for ApiError {
    /// 429 or 503 for a request the engine did not admit.
    fn from(e: SubmitError) -> Self {
        match e {
            SubmitError::TierFull { tier, limit } => Self::tier_full(&tier, limit),
            e @ SubmitError::Unattainable { .. } => Self::retry_later(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                "slo_unattainable",
                e.to_string(),
            ),
            e @ SubmitError::Draining => Self::retry_later(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "shutting_down",
                e.to_string(),
            ),
            other => Self::unavailable(other.to_string()),
        }
    }
}
