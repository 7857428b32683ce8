//! The one error `nitsum._core` raises for invalid input: `ValueError` with the whole chain.

use pyo3::PyErr;

/// `ValueError` with `e`'s message and causes.
pub fn value_error(e: anyhow::Error) -> PyErr {
    pyo3::exceptions::PyValueError::new_err(format!("{e:#}"))
}
