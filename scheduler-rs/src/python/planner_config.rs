//! `nitsum._core.PlannerConfig`: the planner's knobs (`planner::PlannerConfig`), each
//! keyword-only and defaulting to the router's default. NOTE: the Rust type stays primary.

use pyo3::prelude::*;

use crate::planner::PlannerConfig;

/// The planner's knobs (docs/planner.md); what is not given keeps the router's default.
#[pyclass(frozen, get_all, eq, name = "PlannerConfig", module = "nitsum._core")]
#[derive(Debug, Clone, PartialEq)]
pub struct PyPlannerConfig {
    tp_levels: Option<Vec<u32>>,
    prefill_slack: f64,
    max_prefill_batch: u32,
    disaggregation: bool,
    chunk_tokens: f64,
    slo_margin: f64,
    target_utilization: f64,
    keep_utilization: f64,
    switch_gain: f64,
    prior_lengths: (f64, f64),
}

#[pymethods]
impl PyPlannerConfig {
    #[new]
    #[pyo3(signature = (*, tp_levels=None, prefill_slack=None, max_prefill_batch=None,
        disaggregation=None, chunk_tokens=None, slo_margin=None, target_utilization=None,
        keep_utilization=None, switch_gain=None, prior_lengths=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        tp_levels: Option<Vec<u32>>,
        prefill_slack: Option<f64>,
        max_prefill_batch: Option<u32>,
        disaggregation: Option<bool>,
        chunk_tokens: Option<f64>,
        slo_margin: Option<f64>,
        target_utilization: Option<f64>,
        keep_utilization: Option<f64>,
        switch_gain: Option<f64>,
        prior_lengths: Option<(f64, f64)>,
    ) -> Self {
        let d = PlannerConfig::default();
        Self {
            tp_levels: tp_levels.or(d.tp_levels),
            prefill_slack: prefill_slack.unwrap_or(d.prefill_slack),
            max_prefill_batch: max_prefill_batch.unwrap_or(d.max_prefill_batch),
            disaggregation: disaggregation.unwrap_or(d.disaggregation),
            chunk_tokens: chunk_tokens.unwrap_or(d.chunk_tokens),
            slo_margin: slo_margin.unwrap_or(d.slo_margin),
            target_utilization: target_utilization.unwrap_or(d.target_utilization),
            keep_utilization: keep_utilization.unwrap_or(d.keep_utilization),
            switch_gain: switch_gain.unwrap_or(d.switch_gain),
            prior_lengths: prior_lengths.unwrap_or(d.prior_lengths),
        }
    }

    fn __repr__(&self) -> String {
        format!("{self:?}")
    }
}

impl From<&PyPlannerConfig> for PlannerConfig {
    fn from(c: &PyPlannerConfig) -> Self {
        PlannerConfig {
            tp_levels: c.tp_levels.clone(),
            prefill_slack: c.prefill_slack,
            max_prefill_batch: c.max_prefill_batch,
            disaggregation: c.disaggregation,
            chunk_tokens: c.chunk_tokens,
            slo_margin: c.slo_margin,
            target_utilization: c.target_utilization,
            keep_utilization: c.keep_utilization,
            switch_gain: c.switch_gain,
            prior_lengths: c.prior_lengths,
        }
    }
}
