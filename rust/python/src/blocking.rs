//! Blocking calls: the GIL is released, Ctrl-C interrupts, a timeout bounds the wait.

use std::time::Duration;

use creditflow_core::base::wait::Wait;
use creditflow_core::Error;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::error::to_py;

/// Converts an optional timeout in seconds.
pub fn timeout(seconds: Option<f64>) -> PyResult<Option<Duration>> {
    match seconds {
        None => Ok(None),
        Some(s) if s.is_finite() && s >= 0.0 => Ok(Some(Duration::from_secs_f64(s))),
        Some(s) => Err(PyValueError::new_err(format!(
            "timeout must be a non-negative number of seconds, got {s}"
        ))),
    }
}

/// Runs `f` with the GIL released and a [`Wait`] that checks for signals (Ctrl-C) every
/// 50 ms and gives up after `timeout`.
pub fn run<T: Send>(
    py: Python<'_>,
    timeout: Option<Duration>,
    what: &'static str,
    f: impl FnOnce(&mut Wait<'_>) -> Result<T, Error> + Send,
) -> PyResult<T> {
    let mut signal: Option<PyErr> = None;
    let result = py.detach(|| {
        let mut check = || {
            Python::attach(|py| py.check_signals()).map_err(|e| {
                signal = Some(e);
                Error::Interrupted
            })
        };
        let mut wait = Wait::timeout(timeout, what).with_check(&mut check);
        f(&mut wait)
    });
    match result {
        Ok(v) => Ok(v),
        Err(Error::Interrupted) if signal.is_some() => Err(signal.expect("checked")),
        Err(e) => Err(to_py(py, e)),
    }
}
