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
    m.add_function(wrap_pyfunction!(router_main, m)?)?;
    Ok(())
}
