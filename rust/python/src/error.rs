//! The one place core errors become Python exceptions (classes in `creditflow.errors`).

use creditflow_core::Error;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// Creates an instance of `creditflow.errors.<name>(message, **kwargs)`.
fn make(py: Python<'_>, name: &str, message: String, kwargs: Option<&Bound<'_, PyDict>>) -> PyErr {
    let build = || -> PyResult<PyErr> {
        let cls = py.import("creditflow.errors")?.getattr(name)?;
        let exc = cls.call((message.clone(),), kwargs)?;
        Ok(PyErr::from_value(exc))
    };
    build()
        .unwrap_or_else(|e| PyRuntimeError::new_err(format!("{message} (and creditflow.errors failed: {e})")))
}

/// Converts a core error into the matching Python exception.
pub fn to_py(py: Python<'_>, err: Error) -> PyErr {
    let message = err.to_string();
    match err {
        Error::InsufficientBuffers {
            required,
            available,
            total,
            segment_size,
            ..
        } => {
            let kwargs = PyDict::new(py);
            let _ = kwargs.set_item("required", required);
            let _ = kwargs.set_item("available", available);
            let _ = kwargs.set_item("total", total);
            let _ = kwargs.set_item("segment_size", segment_size);
            make(py, "InsufficientBuffersError", message, Some(&kwargs))
        }
        Error::PartitionNotFound(_) => make(py, "PartitionNotFoundError", message, None),
        Error::PartitionExists(_) | Error::SubpartitionOutOfRange { .. } | Error::InvalidArgument(_) => {
            make(py, "InvalidArgumentError", message, None)
        }
        Error::AlreadyConsumed { .. } => make(py, "AlreadyConsumedError", message, None),
        Error::SchemaMismatch { .. } => make(py, "SchemaMismatchError", message, None),
        Error::Timeout(..) => make(py, "TimeoutError", message, None),
        Error::Interrupted => pyo3::exceptions::PyKeyboardInterrupt::new_err(message),
        Error::Closed(_) => make(py, "ClosedError", message, None),
        Error::Protocol(_) => make(py, "ProtocolError", message, None),
        Error::ConnectionLost(_) => make(py, "ConnectionLostError", message, None),
        Error::Authentication(_) => make(py, "AuthenticationError", message, None),
        Error::LimitExceeded(_) => make(py, "LimitExceededError", message, None),
        Error::ProducerFailed(_) => make(py, "ProducerFailedError", message, None),
        Error::Arrow(e) => {
            // Arrow rejects what IPC cannot carry, or a batch it cannot slice/take.
            make(py, "InvalidArgumentError", format!("arrow: {e}"), None)
        }
    }
}

/// Extension: `.py_err(py)?` on core results.
pub trait IntoPyResult<T> {
    /// Maps the error with [`to_py`].
    fn py_err(self, py: Python<'_>) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for Result<T, Error> {
    fn py_err(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|e| to_py(py, e))
    }
}
