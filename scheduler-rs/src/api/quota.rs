//! Per-API-key quotas: requests in flight (`max_inflight`) and request rate
//! (`requests_per_minute` with a token bucket of `burst`), so that one key cannot fill a
//! tier that every key shares. Past either, 429 with `Retry-After` (docs/router.md).
//!
//! NOTE: a request holds its in-flight slot until its response body has been sent or
//! dropped (a streamed answer counts until its last event, a client that hangs up frees it),
//! not merely until the handler returns.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::AppState;
use crate::config::ApiKey;
use crate::errors::ApiError;

/// A token bucket: `capacity` requests at once, refilled at `per_s` a second.
#[derive(Debug)]
struct Bucket {
    capacity: f64,
    per_s: f64,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn new(per_minute: f64, burst: Option<u32>) -> Self {
        let per_s = per_minute / 60.0;
        let capacity = burst.map_or(per_s.ceil().max(1.0), f64::from);
        Bucket {
            capacity,
            per_s,
            tokens: capacity,
            at: Instant::now(),
        }
    }

    /// Take one token at `now`; else how long until one is there.
    fn take(&mut self, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.per_s).min(self.capacity);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.per_s))
        }
    }
}

/// One key's quota state.
#[derive(Debug)]
struct KeyQuota {
    max_inflight: Option<u32>,
    inflight: Arc<AtomicU32>,
    bucket: Option<Mutex<Bucket>>,
}

/// A request's in-flight slot; freed on drop.
#[derive(Debug)]
pub struct Slot(Option<Arc<AtomicU32>>);

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(n) = &self.0 {
            n.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// The quotas of every configured key, indexed as `Auth::keys`.
#[derive(Debug)]
pub struct Quotas {
    keys: Vec<KeyQuota>,
}

impl Quotas {
    pub fn new(keys: &[ApiKey]) -> Self {
        let keys = keys
            .iter()
            .map(|k| KeyQuota {
                max_inflight: k.max_inflight,
                inflight: Arc::new(AtomicU32::new(0)),
                bucket: k
                    .requests_per_minute
                    .map(|r| Mutex::new(Bucket::new(r, k.burst))),
            })
            .collect();
        Quotas { keys }
    }

    /// Admit one request of key `index` at `now`: its slot, or the 429 to answer.
    pub fn admit(&self, index: usize, now: Instant) -> Result<Slot, ApiError> {
        let Some(q) = self.keys.get(index) else {
            return Ok(Slot(None));
        };
        if let Some(limit) = q.max_inflight {
            // NOTE: increment first and undo on refusal: two racing requests cannot both
            // take the last slot.
            if q.inflight.fetch_add(1, Ordering::AcqRel) >= limit {
                q.inflight.fetch_sub(1, Ordering::AcqRel);
                return Err(refused(
                    "key_inflight_limit",
                    format!(
                        "this API key already has {limit} requests in flight (its \
                         max_inflight); retry when one finishes"
                    ),
                    1,
                ));
            }
        }
        let slot = Slot(q.max_inflight.map(|_| q.inflight.clone()));
        if let Some(bucket) = &q.bucket {
            let mut b = bucket.lock().unwrap_or_else(|e| e.into_inner());
            if let Err(wait) = b.take(now) {
                let per_minute = b.per_s * 60.0;
                return Err(refused(
                    "key_rate_limit",
                    format!(
                        "this API key is over its rate limit of {per_minute} requests per \
                         minute; retry in {:.1} s",
                        wait.as_secs_f64()
                    ),
                    wait.as_secs_f64().ceil().max(1.0) as u32,
                ));
            }
        }
        Ok(slot)
    }
}

fn refused(code: &'static str, message: String, retry_after_s: u32) -> ApiError {
    let mut e = ApiError::retry_later(
        StatusCode::TOO_MANY_REQUESTS,
        "rate_limit_error",
        code,
        message,
    );
    e.retry_after_s = Some(retry_after_s);
    e
}

/// Middleware: every POST (the endpoints that do work) with a configured key passes its
/// key's quotas first; requests without a valid key go on to the handler's 401.
pub async fn enforce(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if req.method() != Method::POST {
        return next.run(req).await;
    }
    let Some(index) = state.auth.key_index(req.headers()) else {
        return next.run(req).await;
    };
    let slot = match state.quotas.admit(index, Instant::now()) {
        Ok(slot) => slot,
        Err(e) => return e.into_response(),
    };
    let (parts, body) = next.run(req).await.into_parts();
    // The body's stream owns the slot: it is freed when the body is done or dropped.
    let stream = futures_util::StreamExt::map(body.into_data_stream(), move |chunk| {
        let _held = &slot;
        chunk
    });
    Response::from_parts(parts, Body::from_stream(stream))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(max_inflight: Option<u32>, rpm: Option<f64>, burst: Option<u32>) -> ApiKey {
        ApiKey {
            key: "k".into(),
            max_inflight,
            requests_per_minute: rpm,
            burst,
            ..ApiKey::default()
        }
    }

    #[test]
    fn inflight_slots_are_capped_and_freed_on_drop() {
        let q = Quotas::new(&[key(Some(2), None, None), key(None, None, None)]);
        let now = Instant::now();
        let a = q.admit(0, now).unwrap();
        let _b = q.admit(0, now).unwrap();
        let e = q.admit(0, now).unwrap_err();
        assert_eq!(e.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            (e.code, e.kind, e.retry_after_s),
            (Some("key_inflight_limit"), "rate_limit_error", Some(1))
        );
        // The other key is not affected; a freed slot is taken again.
        assert!(q.admit(1, now).is_ok());
        drop(a);
        assert!(q.admit(0, now).is_ok());
    }

    #[test]
    fn the_bucket_allows_a_burst_then_the_rate() {
        let q = Quotas::new(&[key(None, Some(60.0), Some(3))]);
        let t0 = Instant::now();
        for _ in 0..3 {
            assert!(q.admit(0, t0).is_ok());
        }
        let e = q.admit(0, t0).unwrap_err();
        assert_eq!(e.code, Some("key_rate_limit"));
        assert_eq!(e.retry_after_s, Some(1));
        // One a second at 60 a minute.
        assert!(q.admit(0, t0 + Duration::from_millis(500)).is_err());
        assert!(q.admit(0, t0 + Duration::from_millis(1100)).is_ok());
        assert!(q.admit(0, t0 + Duration::from_millis(1200)).is_err());
        // A long pause refills to the burst, not past it.
        let later = t0 + Duration::from_secs(100);
        for _ in 0..3 {
            assert!(q.admit(0, later).is_ok());
        }
        assert!(q.admit(0, later).is_err());
    }

    #[test]
    fn a_slow_rate_says_how_long_to_wait() {
        let q = Quotas::new(&[key(None, Some(6.0), None)]);
        let t0 = Instant::now();
        assert!(q.admit(0, t0).is_ok()); // default burst: 1
        let e = q.admit(0, t0).unwrap_err();
        assert_eq!(e.retry_after_s, Some(10));
    }
}
