//! `nitsum._core`: the Rust scheduler exposed to Python, typed (`python/nitsum/_core.pyi`).
//! NOTE: the crate's Rust types stay primary; the classes here are converted at this
//! boundary (`tier_classes.rs`, `planning.rs`, `planner_config.rs`, `bind_classes.rs`). Only
//! the simulator takes and returns JSON (its config is a document).

mod bind_classes;
mod error;
mod planner_config;
mod planning;
mod tier_classes;

use pyo3::prelude::*;

use error::value_error;

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

/// Run the cluster simulator on a config JSON (docs/planner.md); returns the result JSON.
/// Releases the GIL while it runs. Raises `ValueError` on invalid input.
#[pyfunction]
fn simulate(py: Python<'_>, config_json: &str) -> PyResult<String> {
    py.detach(|| crate::sim::simulate_json(config_json))
        .map_err(value_error)
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

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(version, m)?)?;
    m.add_function(wrap_pyfunction!(health, m)?)?;
    m.add_function(wrap_pyfunction!(simulate, m)?)?;
    m.add_function(wrap_pyfunction!(router_main, m)?)?;
    m.add_function(wrap_pyfunction!(planning::plan, m)?)?;
    m.add_function(wrap_pyfunction!(planning::default_tiers, m)?)?;
    m.add_class::<tier_classes::PyTier>()?;
    m.add_class::<tier_classes::PyLengthStats>()?;
    m.add_class::<tier_classes::PyTierDemand>()?;
    m.add_class::<planning::PyProfile>()?;
    m.add_class::<planning::PyGroupPlan>()?;
    m.add_class::<planning::PyPlan>()?;
    m.add_class::<planner_config::PyPlannerConfig>()?;
    m.add_class::<bind_classes::PyReplicaLoad>()?;
    m.add_class::<bind_classes::PyBindQuery>()?;
    m.add_class::<bind_classes::PyBindOption>()?;
    m.add_class::<bind_classes::PyBindDecision>()?;
    m.add_class::<bind_classes::BindingModel>()?;
    Ok(())
}
