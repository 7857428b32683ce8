//! API keys and the tier of a request.
//!
//! Rules (docs/router.md): with no keys configured there is no auth. Otherwise a request needs
//! `Authorization: Bearer <key>` with a configured key (401 if missing or wrong). The tier is
//! the `x-nitsum-tier` header, else the body field `tier`, else the key's default tier, else
//! the config's first non-background tier. An unknown tier is a 400; a tier the key may not
//! use is a 403.
//!
//! NOTE: keys are compared in constant time: the given key and every configured key are
//! hashed (SHA-256) and all digests compared without an early exit, so neither the position
//! of the first wrong byte nor which key matched shows in the response time.

use axum::http::HeaderMap;
use sha2::{Digest, Sha256};

use crate::config::ApiKey;
use crate::errors::ApiError;
use crate::ids::TierId;
use crate::tiers::Tier;

/// Header naming the request's tier.
pub const TIER_HEADER: &str = "x-nitsum-tier";

/// Key table and tier list, built once from the config.
#[derive(Debug, Clone)]
pub struct Auth {
    keys: Vec<ApiKey>,
    /// SHA-256 of each key, in `keys` order.
    digests: Vec<[u8; 32]>,
    tiers: Vec<Tier>,
}

impl Auth {
    pub fn new(keys: Vec<ApiKey>, tiers: Vec<Tier>) -> Self {
        let digests = keys.iter().map(|k| digest(&k.key)).collect();
        Auth {
            keys,
            digests,
            tiers,
        }
    }

    /// The configured keys, in config order (`key_index` indexes them).
    pub fn keys(&self) -> &[ApiKey] {
        &self.keys
    }

    /// Index in `keys` of the request's valid API key; `None` without one (or with auth off).
    pub fn key_index(&self, headers: &HeaderMap) -> Option<usize> {
        self.find(bearer(headers)?)
    }

    /// Resolve the tier index of a request from its headers and optional body `tier`.
    pub fn resolve_tier(
        &self,
        headers: &HeaderMap,
        body_tier: Option<&str>,
    ) -> Result<TierId, ApiError> {
        let key = self.authenticate(headers)?;
        let header_tier = headers.get(TIER_HEADER).map(|v| {
            v.to_str()
                .map_err(|_| ApiError::invalid("tier", "x-nitsum-tier is not valid UTF-8"))
        });
        let requested = match header_tier {
            Some(t) => Some(t?),
            None => body_tier,
        };
        let name = match (requested, key) {
            (Some(t), _) => t,
            (None, Some(k)) => match (&k.default_tier, k.tiers.first()) {
                (Some(d), _) => d.as_str(),
                (None, Some(first)) => first.as_str(),
                (None, None) => self.first_foreground(),
            },
            (None, None) => self.first_foreground(),
        };
        let idx = self
            .tiers
            .iter()
            .position(|t| t.name == name)
            .ok_or_else(|| ApiError::invalid("tier", format!("unknown tier `{name}`")))?;
        if let Some(k) = key {
            if !k.tiers.is_empty() && !k.tiers.iter().any(|t| t == name) {
                return Err(ApiError::forbidden(format!(
                    "this API key may not use tier `{name}`"
                )));
            }
        }
        Ok(TierId(idx))
    }

    /// For `/admin/*` (and a restricted `/metrics`): with keys configured, an admin key
    /// (401 without a valid key, 403 with a non-admin one); open when auth is off.
    pub fn require_admin(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        match self.authenticate(headers)? {
            Some(k) if !k.admin => Err(ApiError::forbidden(
                "this API key may not read the admin endpoints",
            )),
            _ => Ok(()),
        }
    }

    /// The matching key; `None` when auth is off. 401 when a key is needed and not valid.
    fn authenticate(&self, headers: &HeaderMap) -> Result<Option<&ApiKey>, ApiError> {
        if self.keys.is_empty() {
            return Ok(None);
        }
        let given = bearer(headers)
            .ok_or_else(|| ApiError::unauthorized("missing API key (Authorization: Bearer ...)"))?;
        self.find(given)
            .map(|i| Some(&self.keys[i]))
            .ok_or_else(|| ApiError::unauthorized("invalid API key"))
    }

    /// The index of key `given`: every digest is compared in full (see the module's NOTE).
    fn find(&self, given: &str) -> Option<usize> {
        let given = digest(given);
        let mut found = None;
        for (i, d) in self.digests.iter().enumerate() {
            if digests_equal(d, &given) {
                found = Some(i);
            }
        }
        found
    }

    fn first_foreground(&self) -> &str {
        // NOTE: config validation guarantees a non-background tier exists.
        self.tiers
            .iter()
            .find(|t| !t.background)
            .map_or("", |t| t.name.as_str())
    }
}

/// The key of an `Authorization: Bearer <key>` header.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim)
}

fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// Equality of two digests that reads every byte whatever the first difference.
fn digests_equal(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::default_tiers;
    use axum::http::StatusCode;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    fn key(key: &str, tiers: &[&str], default: Option<&str>) -> ApiKey {
        ApiKey {
            key: key.into(),
            tiers: tiers.iter().map(|s| s.to_string()).collect(),
            default_tier: default.map(String::from),
            ..ApiKey::default()
        }
    }

    #[test]
    fn no_keys_means_no_auth_and_first_foreground_default() {
        let auth = Auth::new(vec![], default_tiers());
        assert_eq!(auth.resolve_tier(&HeaderMap::new(), None), Ok(TierId(0)));
        assert_eq!(
            auth.resolve_tier(&HeaderMap::new(), Some("relaxed")),
            Ok(TierId(1))
        );
        // The header wins over the body field.
        let h = headers(&[(TIER_HEADER, "background")]);
        assert_eq!(auth.resolve_tier(&h, Some("relaxed")), Ok(TierId(2)));
        let err = auth
            .resolve_tier(&HeaderMap::new(), Some("gold"))
            .unwrap_err();
        assert_eq!(
            (err.status, err.param.as_deref()),
            (StatusCode::BAD_REQUEST, Some("tier"))
        );
    }

    #[test]
    fn keys_gate_tiers() {
        let auth = Auth::new(
            vec![
                key("sk-gold", &["strict", "relaxed"], Some("relaxed")),
                key("sk-bg", &["background"], None),
                key("sk-all", &[], None),
            ],
            default_tiers(),
        );
        let none = auth.resolve_tier(&HeaderMap::new(), None).unwrap_err();
        assert_eq!(none.status, StatusCode::UNAUTHORIZED);
        let wrong = headers(&[("authorization", "Bearer nope")]);
        assert_eq!(
            auth.resolve_tier(&wrong, None).unwrap_err().status,
            StatusCode::UNAUTHORIZED
        );

        let gold = headers(&[("authorization", "Bearer sk-gold")]);
        assert_eq!(auth.resolve_tier(&gold, None), Ok(TierId(1)));
        assert_eq!(auth.resolve_tier(&gold, Some("strict")), Ok(TierId(0)));
        let forbidden = auth.resolve_tier(&gold, Some("background")).unwrap_err();
        assert_eq!(forbidden.status, StatusCode::FORBIDDEN);

        let bg = headers(&[("authorization", "Bearer sk-bg")]);
        assert_eq!(auth.resolve_tier(&bg, None), Ok(TierId(2)));
        let mut bg_strict = bg.clone();
        bg_strict.insert(TIER_HEADER, "strict".parse().unwrap());
        assert_eq!(
            auth.resolve_tier(&bg_strict, None).unwrap_err().status,
            StatusCode::FORBIDDEN
        );

        let all = headers(&[("authorization", "Bearer sk-all")]);
        assert_eq!(auth.resolve_tier(&all, Some("background")), Ok(TierId(2)));
        assert_eq!(auth.resolve_tier(&all, None), Ok(TierId(0)));
    }

    #[test]
    fn key_lookup_compares_digests_in_full() {
        let auth = Auth::new(
            vec![key("sk-aaaa", &[], None), key("sk-aaab", &[], None)],
            default_tiers(),
        );
        let with = |k: &str| headers(&[("authorization", &format!("Bearer {k}"))]);
        assert_eq!(auth.key_index(&with("sk-aaaa")), Some(0));
        assert_eq!(auth.key_index(&with("sk-aaab")), Some(1));
        // A prefix, an extension and a one-byte change are all different keys.
        for wrong in ["sk-aaa", "sk-aaaaa", "sk-aaac", ""] {
            assert_eq!(auth.key_index(&with(wrong)), None, "{wrong}");
        }
        assert_eq!(auth.key_index(&HeaderMap::new()), None);
        assert!(digests_equal(&digest("x"), &digest("x")));
        assert!(!digests_equal(&digest("x"), &digest("y")));
    }
}
