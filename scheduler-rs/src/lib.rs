//! Nitsum global scheduler: router (HTTP, tokenization, tiers, dispatch, control loop),
//! goodput planner and cluster simulator. The same code runs in the `nitsum-router`
//! binary and, with the `python` feature, inside the `nitsum._core` extension module.

pub mod dispatch;
pub mod plan;
pub mod planner;
pub mod profile;
#[cfg(feature = "python")]
mod python;
pub mod sim;
pub mod stats;
pub mod tiers;

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
