//! Per-tier sliding-window workload statistics (architecture §4 "Stats"): arrival rate over the
//! control window, prompt and output length distributions over a (longer) profile window.
//!
//! Pure: every call takes `now` (seconds on any monotonic clock), so the router feeds it
//! wall time and the simulator feeds simulated time.

mod demand;
mod lengths;
mod window;

pub use demand::{TierDemand, DEFAULT_PRIOR_LENGTHS};
pub use lengths::{censored_mean, censored_stats, LengthStats};
pub use window::{insert_sorted, StatsConfig, WindowStats};

#[cfg(test)]
mod tests;
