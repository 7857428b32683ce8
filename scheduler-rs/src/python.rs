//! `nitsum._core`: the Rust scheduler exposed to Python.

use pyo3::prelude::*;

/// Version of the native scheduler library.
#[pyfunction]
fn version() -> &'static str {
    crate::VERSION
}

/// Liveness of the native library ("ok").
#[pyfunction]
fn health() -> &'static str {
    crate::health()
}

fn value_error(e: anyhow::Error) -> PyErr {
    pyo3::exceptions::PyValueError::new_err(format!("{e:#}"))
}

/// One planner decision (docs/planner.md): profile JSON, tiers JSON (list of tiers), demand
/// JSON (list of `{tier, rate_rps, prompt: {mean,..}, output: {mean,..}}`), device count and
/// optionally the previous plan JSON and a planner config JSON. Returns the plan JSON with
/// `batch_caps`. Raises `ValueError` on invalid input.
#[pyfunction]
#[pyo3(signature = (profile_json, tiers_json, demand_json, num_devices, previous_plan_json=None, config_json=None))]
fn plan(
    py: Python<'_>,
    profile_json: &str,
    tiers_json: &str,
    demand_json: &str,
    num_devices: u32,
    previous_plan_json: Option<&str>,
    config_json: Option<&str>,
) -> PyResult<String> {
    py.detach(|| {
        crate::planner::plan_json(
            profile_json,
            tiers_json,
            demand_json,
            num_devices,
            previous_plan_json,
            config_json,
        )
    })
    .map_err(value_error)
}

/// Run the cluster simulator on a config JSON (docs/planner.md); returns the result JSON.
/// Releases the GIL while it runs. Raises `ValueError` on invalid input.
#[pyfunction]
fn simulate(py: Python<'_>, config_json: &str) -> PyResult<String> {
    py.detach(|| crate::sim::simulate_json(config_json))
        .map_err(value_error)
}

/// The router's default tiers as JSON (`config::default_tiers`): `nitsum bench` uses the
/// same ones, so a benchmark without `--tier` measures what a default router plans for.
#[pyfunction]
fn default_tiers() -> PyResult<String> {
    serde_json::to_string(&crate::config::default_tiers())
        .map_err(|e| value_error(anyhow::anyhow!(e)))
}

/// Run the `nitsum-router` entry point with `argv` (program name first, like `sys.argv`;
/// default: `sys.argv`), blocking until the router exits; returns the exit code. The GIL is
/// released meanwhile. A console script can point straight at it:
/// `nitsum-router = "nitsum._core:router_main"`.
#[pyfunction]
#[pyo3(signature = (argv=None))]
fn router_main(py: Python<'_>, argv: Option<Vec<String>>) -> PyResult<i32> {
    let argv = match argv {
        Some(a) => a,
        None => py.import("sys")?.getattr("argv")?.extract()?,
    };
    Ok(py.detach(move || crate::server::cli_main(argv)))
}

/// The cost model of per-request TP binding (`binding/`) over one profile JSON: the very
/// decisions the simulator takes. Raises `ValueError` on an invalid profile.
#[pyclass(frozen)]
struct BindingModel {
    inner: crate::binding::BindingModel,
}

#[pymethods]
impl BindingModel {
    #[new]
    fn new(profile_json: &str) -> PyResult<Self> {
        let inner = crate::binding::BindingModel::from_json(profile_json).map_err(value_error)?;
        Ok(Self { inner })
    }

    /// The decision for a query JSON (`binding::BindQuery`), as `binding::BindDecision` JSON.
    /// Raises `ValueError` on an invalid query or a TP level the profile lacks.
    fn decide(&self, query_json: &str) -> PyResult<String> {
        self.inner.decide_json(query_json).map_err(value_error)
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
        let r = crate::binding::ReplicaLoad {
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

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(version, m)?)?;
    m.add_function(wrap_pyfunction!(health, m)?)?;
    m.add_function(wrap_pyfunction!(plan, m)?)?;
    m.add_function(wrap_pyfunction!(simulate, m)?)?;
    m.add_function(wrap_pyfunction!(default_tiers, m)?)?;
    m.add_function(wrap_pyfunction!(router_main, m)?)?;
    m.add_class::<BindingModel>()?;
    Ok(())
}
