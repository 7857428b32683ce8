//! A selection round's outcome ([`Choice`]) and what a simulated cluster asks of whoever makes
//! it ([`Choose`]).
//!
//! NOTE: the chooser (`chooser/`) runs shadow clusters (`shadow/`), and a cluster of the
//! adaptive policy runs selection rounds; the cluster names only this trait, and the
//! simulation's entry (`sim::simulate`) hands it a `Chooser`, so the modules form no cycle.

use serde::{Deserialize, Serialize};

use crate::planner::strategy::Strategy;

use super::bind_types::BindingVerdict;
use super::lookahead::{Candidate, Situation};

/// The outcome of a selection round, with every candidate and the reason.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Choice {
    pub chosen: Strategy,
    pub candidates: Vec<Candidate>,
    pub reason: String,
    /// Shadow choice with a bound tier: binding on vs off for the chosen strategy's shadow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binding: Option<BindingVerdict>,
}

/// Goodput the run actually delivered: weighted met requests per second among those that
/// arrived in `[t0, t1)`, as known at the time of the call.
pub type Delivered<'a> = &'a dyn Fn(f64, f64) -> f64;

/// The layout choice across selection rounds, as a simulated cluster drives it.
pub trait Choose: Send {
    /// Seconds of arrivals a round looks back on (the situation's `recent`).
    fn lookback_s(&self) -> f64;

    /// One selection round at time `now`: the strategy to run until the next one, and why.
    fn round(&mut self, s: &Situation, now: f64, delivered: Delivered) -> Choice;
}
