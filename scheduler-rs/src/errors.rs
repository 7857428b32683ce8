//! API errors in the OpenAI shape: `{"error": {"message", "type", "param", "code"}}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An error returned to an HTTP client.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI error type, e.g. `invalid_request_error`.
    pub kind: &'static str,
    /// The offending request field, when there is one.
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Seconds for a `Retry-After` header (429/503 that a retry may clear).
    pub retry_after_s: Option<u32>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            retry_after_s: None,
        }
    }

    /// A refusal that a retry may clear: `code`, and `Retry-After: 1`.
    pub fn retry_later(
        status: StatusCode,
        kind: &'static str,
        code: &'static str,
        msg: String,
    ) -> Self {
        let mut e = Self::new(status, kind, msg);
        e.code = Some(code);
        e.retry_after_s = Some(1);
        e
    }

    /// 429: the tier already holds as many requests as it admits (`Tier::max_inflight`).
    pub fn tier_full(tier: &str, limit: u32) -> Self {
        Self::retry_later(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            "tier_full",
            format!(
                "tier `{tier}` already has {limit} requests in flight (its max_inflight); \
                 retry later"
            ),
        )
    }

    /// 408: the request ran past the router's per-request deadline, or the client took too
    /// long to send it.
    pub fn timeout(message: impl Into<String>) -> Self {
        let mut e = Self::new(StatusCode::REQUEST_TIMEOUT, "timeout_error", message);
        e.code = Some("request_timeout");
        e
    }

    /// 400 about request field `param`.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        let mut e = Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message);
        e.param = Some(param.to_string());
        e
    }

    /// 400 for a body that is not valid JSON or does not fit the schema.
    pub fn bad_json(message: impl Into<String>) -> Self {
        let mut e = Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message);
        e.code = Some("invalid_json");
        e
    }

    /// 401: missing or wrong API key.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        let mut e = Self::new(StatusCode::UNAUTHORIZED, "authentication_error", message);
        e.code = Some("invalid_api_key");
        e
    }

    /// 403: the key may not use this tier.
    pub fn forbidden(message: impl Into<String>) -> Self {
        let mut e = Self::new(StatusCode::FORBIDDEN, "permission_error", message);
        e.param = Some("tier".into());
        e
    }

    /// 404: unknown model.
    pub fn model_not_found(model: &str) -> Self {
        let mut e = Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("The model `{model}` does not exist."),
        );
        e.param = Some("model".into());
        e.code = Some("model_not_found");
        e
    }

    /// 503: no worker can take the request now.
    pub fn unavailable(message: impl Into<String>) -> Self {
        let mut e = Self::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message);
        e.code = Some("no_worker_available");
        e
    }

    /// Any status with its message (errors raised outside the handlers: unknown path, wrong
    /// method, body too large).
    pub fn from_status(status: StatusCode, message: impl Into<String>) -> Self {
        let kind = if status.is_server_error() {
            "server_error"
        } else {
            "invalid_request_error"
        };
        let mut e = Self::new(status, kind, message);
        e.code = match status {
            StatusCode::NOT_FOUND => Some("not_found"),
            StatusCode::METHOD_NOT_ALLOWED => Some("method_not_allowed"),
            StatusCode::PAYLOAD_TOO_LARGE => Some("payload_too_large"),
            _ => None,
        };
        e
    }

    /// 500: the request failed inside the serving system (e.g. a worker died mid-stream).
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// The JSON body (also used as an SSE error event).
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after_s {
            r.headers_mut()
                .insert(axum::http::header::RETRY_AFTER, s.into());
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_shape_has_all_four_fields() {
        let e = ApiError::invalid("max_tokens", "max_tokens must be at least 1");
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(
            e.body(),
            json!({"error": {"message": "max_tokens must be at least 1",
                             "type": "invalid_request_error", "param": "max_tokens",
                             "code": null}})
        );
        let nf = ApiError::model_not_found("gpt-x").body();
        assert_eq!(nf["error"]["code"], "model_not_found");
        assert_eq!(
            ApiError::unauthorized("no").status,
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(ApiError::forbidden("no").status, StatusCode::FORBIDDEN);
        assert_eq!(
            ApiError::unavailable("none").status,
            StatusCode::SERVICE_UNAVAILABLE
        );
    }
}
