//! Nitsum global scheduler: router (HTTP, tokenization, tiers, dispatch, control loop),
//! goodput planner and cluster simulator. The same code runs in the `nitsum-router`
//! binary and, with the `python` feature, inside the `nitsum._core` extension module.

pub mod api;
pub mod auth;
pub mod binding;
pub mod config;
pub mod control_loop;
pub mod dispatch;
pub mod errors;
pub mod fasthash;
pub mod heap;
pub mod ids;
pub mod lease;
pub mod metrics;
pub mod mock_worker;
pub mod parsers;
pub mod plan;
pub mod planner;
pub mod prefix_index;
pub mod profile;
pub mod protocols;
#[cfg(feature = "python")]
mod python;
pub mod registry;
pub mod routers;
pub mod server;
pub mod sim;
pub mod state;
pub mod stats;
#[doc(hidden)]
pub mod testutil;
pub mod tiers;
pub mod tokenize;
pub mod transport;
pub mod worker_auth;

/// Crate version, also reported by `nitsum._core.version()`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Liveness answer shared by `/health` and `nitsum._core.health()`.
pub fn health() -> &'static str {
    "ok"
}

#[cfg(test)]
mod tests {
    #[test]
    fn health_is_ok() {
        assert_eq!(super::health(), "ok");
    }
}
