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

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(version, m)?)?;
    m.add_function(wrap_pyfunction!(health, m)?)?;
    Ok(())
}
