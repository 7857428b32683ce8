//! One tier's demand as the planner reads it, and the request shape assumed before any was
//! observed.

use serde::{Deserialize, Serialize};

use super::lengths::LengthStats;

/// What the planner needs to know about one tier's current demand.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TierDemand {
    pub tier: String,
    /// Arrivals per second over the control window.
    pub rate_rps: f64,
    pub prompt: LengthStats,
    pub output: LengthStats,
}

/// Request shape (mean prompt, mean output tokens) assumed where none was observed yet; the
/// default of `PlannerConfig::prior_lengths` and of the window stats' output tail.
pub const DEFAULT_PRIOR_LENGTHS: (f64, f64) = (1024.0, 256.0);
