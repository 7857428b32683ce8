//! `nitsum._core.BindingModel` and its question and answer: `ReplicaLoad`, `BindQuery`,
//! `BindOption`, `BindDecision` (scheduler-rs `binding/`, docs/planner.md). NOTE: the Rust
//! types in `binding::query` stay primary; these are field-for-field copies converted at the
//! boundary. A mode is `"dp"`, `"prefill"` or `"full"`.

use pyo3::prelude::*;

use super::error::value_error;
use super::planning::PyProfile;
use crate::binding::{BindDecision, BindMode, BindOption, BindQuery, ReplicaLoad};

/// One plan group inside the block a binding would borrow (`binding::ReplicaLoad`); its
/// defaults are an idle DP replica.
#[pyclass(frozen, get_all, eq, name = "ReplicaLoad", module = "nitsum._core")]
#[derive(Debug, Clone, PartialEq)]
pub struct PyReplicaLoad {
    tp: u32,
    decoding: u32,
    context: f64,
    prefill_tokens: u32,
    slowdown: f64,
}

#[pymethods]
impl PyReplicaLoad {
    #[new]
    #[pyo3(signature = (tp=1, decoding=0, context=0.0, prefill_tokens=0, slowdown=1.0))]
    fn new(tp: u32, decoding: u32, context: f64, prefill_tokens: u32, slowdown: f64) -> Self {
        Self {
            tp,
            decoding,
            context,
            prefill_tokens,
            slowdown,
        }
    }

    fn __repr__(&self) -> String {
        format!("{self:?}")
    }
}

impl From<&PyReplicaLoad> for ReplicaLoad {
    fn from(r: &PyReplicaLoad) -> Self {
        ReplicaLoad {
            tp: r.tp,
            decoding: r.decoding,
            context: r.context,
            prefill_tokens: r.prefill_tokens,
            slowdown: r.slowdown,
        }
    }
}

/// A request a binding is considered for (`binding::BindQuery`); defaults as in its JSON.
#[pyclass(frozen, get_all, eq, name = "BindQuery", module = "nitsum._core")]
#[derive(Debug, Clone, PartialEq)]
pub struct PyBindQuery {
    level: u32,
    prompt_tokens: u32,
    output_tokens: u32,
    replicas: Vec<PyReplicaLoad>,
    context_tokens: u32,
    ttft_ms: Option<f64>,
    tpot_ms: Option<f64>,
    weight: f64,
    token_budget: u32,
    handoff_ms_per_token: f64,
    bound_slowdown: f64,
    replica_output_tokens: f64,
    replica_weight: f64,
    wait_ms: f64,
}

#[pymethods]
impl PyBindQuery {
    #[new]
    #[pyo3(signature = (level, prompt_tokens, output_tokens, replicas, context_tokens=0,
        ttft_ms=None, tpot_ms=None, weight=1.0, token_budget=0, handoff_ms_per_token=0.0,
        bound_slowdown=1.0, replica_output_tokens=128.0, replica_weight=1.0, wait_ms=0.0))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        level: u32,
        prompt_tokens: u32,
        output_tokens: u32,
        replicas: Vec<PyReplicaLoad>,
        context_tokens: u32,
        ttft_ms: Option<f64>,
        tpot_ms: Option<f64>,
        weight: f64,
        token_budget: u32,
        handoff_ms_per_token: f64,
        bound_slowdown: f64,
        replica_output_tokens: f64,
        replica_weight: f64,
        wait_ms: f64,
    ) -> Self {
        Self {
            level,
            prompt_tokens,
            output_tokens,
            replicas,
            context_tokens,
            ttft_ms,
            tpot_ms,
            weight,
            token_budget,
            handoff_ms_per_token,
            bound_slowdown,
            replica_output_tokens,
            replica_weight,
            wait_ms,
        }
    }

    fn __repr__(&self) -> String {
        format!("{self:?}")
    }
}

impl From<&PyBindQuery> for BindQuery {
    fn from(q: &PyBindQuery) -> Self {
        BindQuery {
            level: q.level,
            prompt_tokens: q.prompt_tokens,
            output_tokens: q.output_tokens,
            context_tokens: q.context_tokens,
            ttft_ms: q.ttft_ms,
            tpot_ms: q.tpot_ms,
            weight: q.weight,
            replicas: q.replicas.iter().map(ReplicaLoad::from).collect(),
            token_budget: q.token_budget,
            handoff_ms_per_token: q.handoff_ms_per_token,
            bound_slowdown: q.bound_slowdown,
            replica_output_tokens: q.replica_output_tokens,
            replica_weight: q.replica_weight,
            wait_ms: q.wait_ms,
        }
    }
}

fn mode_name(mode: BindMode) -> &'static str {
    match mode {
        BindMode::Dp => "dp",
        BindMode::Prefill => "prefill",
        BindMode::Full => "full",
    }
}

/// One option's estimate (`binding::BindOption`).
#[pyclass(frozen, get_all, eq, name = "BindOption", module = "nitsum._core")]
#[derive(Debug, Clone, PartialEq)]
pub struct PyBindOption {
    mode: &'static str,
    ttft_ms: f64,
    tpot_ms: f64,
    meets: f64,
    lost_tokens: f64,
    value: f64,
}

impl From<BindOption> for PyBindOption {
    fn from(o: BindOption) -> Self {
        PyBindOption {
            mode: mode_name(o.mode),
            ttft_ms: o.ttft_ms,
            tpot_ms: o.tpot_ms,
            meets: o.meets,
            lost_tokens: o.lost_tokens,
            value: o.value,
        }
    }
}

/// The decision and what it weighed (`binding::BindDecision`): `replica` indexes the
/// query's replicas; `gain` is the chosen value minus DP's.
#[pyclass(frozen, get_all, eq, name = "BindDecision", module = "nitsum._core")]
#[derive(Debug, Clone, PartialEq)]
pub struct PyBindDecision {
    mode: &'static str,
    level: u32,
    replica: usize,
    gain: f64,
    options: Vec<PyBindOption>,
}

#[pymethods]
impl PyBindDecision {
    fn __repr__(&self) -> String {
        format!("{self:?}")
    }
}

impl From<BindDecision> for PyBindDecision {
    fn from(d: BindDecision) -> Self {
        PyBindDecision {
            mode: mode_name(d.mode),
            level: d.level,
            replica: d.replica,
            gain: d.gain,
            options: d.options.into_iter().map(PyBindOption::from).collect(),
        }
    }
}

/// The cost model of per-request TP binding (`binding/`) over one profile: the very
/// decisions the simulator takes.
#[pyclass(frozen)]
pub struct BindingModel {
    inner: crate::binding::BindingModel,
}

#[pymethods]
impl BindingModel {
    #[new]
    fn new(profile: &PyProfile) -> Self {
        let inner = crate::binding::BindingModel::new(profile.inner.clone());
        Self { inner }
    }

    /// The decision for `query`. Raises `ValueError` on an invalid query (no replicas, no
    /// output) or a TP level the profile lacks.
    fn decide(&self, query: &PyBindQuery) -> PyResult<PyBindDecision> {
        let q = BindQuery::from(query);
        self.inner
            .decide(&q)
            .map(PyBindDecision::from)
            .map_err(value_error)
    }

    /// The profile's time (ms) of one iteration of a group at TP `tp` decoding `decoding`
    /// sequences of mean `context` tokens with `prefill_tokens` prompt tokens (what the
    /// worker divides its measured step times by). Raises `ValueError` for a level the
    /// profile lacks.
    fn iteration_ms(
        &self,
        tp: u32,
        decoding: u32,
        context: f64,
        prefill_tokens: u32,
    ) -> PyResult<f64> {
        let r = ReplicaLoad {
            tp,
            decoding,
            context,
            prefill_tokens,
            slowdown: 1.0,
        };
        self.inner
            .check_level(tp)
            .map(|()| self.inner.iteration_ms(&r, 0))
            .map_err(value_error)
    }
}
