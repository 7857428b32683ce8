//! API keys: the tiers each may use and its quotas, from the config file or the environment.

use anyhow::{Context, Result};
use serde::Deserialize;

/// Environment variable with API keys, one a line (`nitsum serve --api-key`): kept off the
/// command line that `ps` shows. Each may use every tier, like a config key without `tiers`.
pub const API_KEYS_ENV: &str = "NITSUM_API_KEYS";

/// The keys of `NITSUM_API_KEYS` (blank lines skipped).
pub fn env_api_keys(text: &str) -> Result<Vec<ApiKey>> {
    text.lines()
        .map(str::trim)
        .filter(|k| !k.is_empty())
        // NOTE: through serde, so that every other field takes its config-file default.
        .map(|k| serde_json::from_value(serde_json::json!({ "key": k })).context(API_KEYS_ENV))
        .collect()
}

/// An API key, the tiers it may use and its quotas (absent: unlimited).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ApiKey {
    pub key: String,
    /// Tiers this key may request; empty = all tiers.
    #[serde(default)]
    pub tiers: Vec<String>,
    /// Tier used when the request names none; default: the key's first allowed tier.
    #[serde(default)]
    pub default_tier: Option<String>,
    /// May read `/admin/*` (and `/metrics` with `restrict_metrics`).
    #[serde(default)]
    pub admin: bool,
    /// Most requests of this key in flight at once (api/quota.rs); more get 429.
    #[serde(default)]
    pub max_inflight: Option<u32>,
    /// Sustained request rate of this key (a token bucket refilled at this rate).
    #[serde(default)]
    pub requests_per_minute: Option<f64>,
    /// The bucket's size: requests the key may send at once after a quiet spell
    /// (default: one second's worth of `requests_per_minute`, at least 1).
    #[serde(default)]
    pub burst: Option<u32>,
}
