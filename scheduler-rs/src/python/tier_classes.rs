//! `nitsum._core.Tier`, `LengthStats` and `TierDemand`: the planner's inputs as Python sees
//! them. NOTE: the Rust types (`tiers::Tier`, `stats::TierDemand`) stay primary; these are
//! field-for-field copies converted at the boundary (a field added there fails to compile
//! here until it is added).

use pyo3::prelude::*;

use crate::stats::{LengthStats, TierDemand};
use crate::tiers::Tier;

/// One SLO tier (`tiers::Tier`; docs/tiers.md), as the router's tiers config lists it.
#[pyclass(frozen, get_all, eq, name = "Tier", module = "nitsum._core")]
#[derive(Debug, Clone, PartialEq)]
pub struct PyTier {
    name: String,
    ttft_ms: f64,
    tpot_ms: f64,
    weight: f64,
    background: bool,
    max_inflight: Option<u32>,
    max_tokens: Option<u32>,
    reject_unattainable: bool,
    preempt: bool,
    bind_tp: Option<u32>,
}

#[pymethods]
impl PyTier {
    #[new]
    #[pyo3(signature = (name, ttft_ms, tpot_ms, weight=1.0, background=false, max_inflight=None,
        max_tokens=None, reject_unattainable=false, preempt=true, bind_tp=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        name: String,
        ttft_ms: f64,
        tpot_ms: f64,
        weight: f64,
        background: bool,
        max_inflight: Option<u32>,
        max_tokens: Option<u32>,
        reject_unattainable: bool,
        preempt: bool,
        bind_tp: Option<u32>,
    ) -> Self {
        Self {
            name,
            ttft_ms,
            tpot_ms,
            weight,
            background,
            max_inflight,
            max_tokens,
            reject_unattainable,
            preempt,
            bind_tp,
        }
    }

    fn __repr__(&self) -> String {
        format!("{self:?}")
    }
}

impl From<&PyTier> for Tier {
    fn from(t: &PyTier) -> Self {
        Tier {
            name: t.name.clone(),
            ttft_ms: t.ttft_ms,
            tpot_ms: t.tpot_ms,
            weight: t.weight,
            background: t.background,
            max_inflight: t.max_inflight,
            max_tokens: t.max_tokens,
            reject_unattainable: t.reject_unattainable,
            preempt: t.preempt,
            bind_tp: t.bind_tp,
        }
    }
}

impl From<Tier> for PyTier {
    fn from(t: Tier) -> Self {
        PyTier {
            name: t.name,
            ttft_ms: t.ttft_ms,
            tpot_ms: t.tpot_ms,
            weight: t.weight,
            background: t.background,
            max_inflight: t.max_inflight,
            max_tokens: t.max_tokens,
            reject_unattainable: t.reject_unattainable,
            preempt: t.preempt,
            bind_tp: t.bind_tp,
        }
    }
}

/// Length statistics of one tier's prompts or outputs, in tokens (`stats::LengthStats`).
#[pyclass(frozen, get_all, eq, name = "LengthStats", module = "nitsum._core")]
#[derive(Debug, Clone, PartialEq)]
pub struct PyLengthStats {
    count: u64,
    mean: f64,
    p50: f64,
    p90: f64,
    p99: f64,
}

#[pymethods]
impl PyLengthStats {
    /// What is not given is 0, as in the JSON form (the planner reads `mean`).
    #[new]
    #[pyo3(signature = (mean, count=0, p50=0.0, p90=0.0, p99=0.0))]
    fn new(mean: f64, count: u64, p50: f64, p90: f64, p99: f64) -> Self {
        Self {
            count,
            mean,
            p50,
            p90,
            p99,
        }
    }

    fn __repr__(&self) -> String {
        format!("{self:?}")
    }
}

impl From<&PyLengthStats> for LengthStats {
    fn from(s: &PyLengthStats) -> Self {
        LengthStats {
            count: s.count,
            mean: s.mean,
            p50: s.p50,
            p90: s.p90,
            p99: s.p99,
        }
    }
}

/// One tier's current demand (`stats::TierDemand`): arrivals per second and lengths.
#[pyclass(frozen, get_all, eq, name = "TierDemand", module = "nitsum._core")]
#[derive(Debug, Clone, PartialEq)]
pub struct PyTierDemand {
    tier: String,
    rate_rps: f64,
    prompt: PyLengthStats,
    output: PyLengthStats,
}

#[pymethods]
impl PyTierDemand {
    #[new]
    fn new(tier: String, rate_rps: f64, prompt: PyLengthStats, output: PyLengthStats) -> Self {
        Self {
            tier,
            rate_rps,
            prompt,
            output,
        }
    }

    fn __repr__(&self) -> String {
        format!("{self:?}")
    }
}

impl From<&PyTierDemand> for TierDemand {
    fn from(d: &PyTierDemand) -> Self {
        TierDemand {
            tier: d.tier.clone(),
            rate_rps: d.rate_rps,
            prompt: (&d.prompt).into(),
            output: (&d.output).into(),
        }
    }
}
