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

/// Run the `nitsum-router` entry point with `argv` (program name first, like `sys.argv`),
/// blocking until the router exits; returns the exit code. The GIL is released meanwhile so
/// Python threads keep running. Used by the `nitsum-router` console script.
#[pyfunction]
fn router_main(py: Python<'_>, argv: Vec<String>) -> i32 {
    py.detach(move || crate::server::cli_main(argv))
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(version, m)?)?;
    m.add_function(wrap_pyfunction!(health, m)?)?;
    m.add_function(wrap_pyfunction!(router_main, m)?)?;
    Ok(())
}
