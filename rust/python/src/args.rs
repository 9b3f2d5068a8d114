//! Checks on arguments and on the calling process, shared by the classes.

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

/// A non-negative count; a negative one is a `ValueError` (not pyo3's `OverflowError`).
pub(crate) fn count_arg(value: i64, name: &str) -> PyResult<usize> {
    usize::try_from(value).map_err(|_| PyValueError::new_err(format!("{name} must be >= 0, got {value}")))
}

/// Fails if used in a process other than the one that created the object (after fork).
pub(crate) fn check_pid(pid: u32, what: &str) -> PyResult<()> {
    let now = std::process::id();
    if now != pid {
        return Err(PyRuntimeError::new_err(format!(
            "this {what} was created in process {pid} and cannot be used in process {now} (after fork); \
             create a new NetworkEnvironment in this process"
        )));
    }
    Ok(())
}
