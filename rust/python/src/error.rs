//! The one place core errors become Python exceptions.
//!
//! The exception classes are defined in Python (`creditflow/errors.py`), not with pyo3's
//! `create_exception!`: most have two bases (`CreditflowError` and a built-in such as
//! `ValueError`, `ConnectionError` or `TimeoutError`, so `except ValueError` works as a Python
//! user expects) and `InsufficientBuffersError` takes keyword attributes, neither of which
//! `create_exception!` can express; and their docs belong with the package. `errors.py` hands
//! the classes to this module once, at import (`_native._register_errors`), and they are
//! kept in a table indexed by [`Kind`]: raising looks nothing up by name and imports nothing.
//!
//! `creditflow/__init__.py` imports `errors` before anything can raise, so an unregistered
//! table is a packaging bug; a core error raised then becomes a `RuntimeError` saying so.

use creditflow_core::Error;
use pyo3::exceptions::{PyKeyboardInterrupt, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyType};

/// The Python exception class a core error maps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    InsufficientBuffers,
    PartitionNotFound,
    InvalidArgument,
    AlreadyConsumed,
    SchemaMismatch,
    Timeout,
    Closed,
    Protocol,
    ConnectionLost,
    Authentication,
    LimitExceeded,
    ProducerFailed,
    Spill,
}

impl Kind {
    const ALL: [Kind; 13] = [
        Kind::InsufficientBuffers,
        Kind::PartitionNotFound,
        Kind::InvalidArgument,
        Kind::AlreadyConsumed,
        Kind::SchemaMismatch,
        Kind::Timeout,
        Kind::Closed,
        Kind::Protocol,
        Kind::ConnectionLost,
        Kind::Authentication,
        Kind::LimitExceeded,
        Kind::ProducerFailed,
        Kind::Spill,
    ];

    /// The class's name in `creditflow.errors` (the key `_register_errors` expects).
    const fn class_name(self) -> &'static str {
        match self {
            Kind::InsufficientBuffers => "InsufficientBuffersError",
            Kind::PartitionNotFound => "PartitionNotFoundError",
            Kind::InvalidArgument => "InvalidArgumentError",
            Kind::AlreadyConsumed => "AlreadyConsumedError",
            Kind::SchemaMismatch => "SchemaMismatchError",
            Kind::Timeout => "TimeoutError",
            Kind::Closed => "ClosedError",
            Kind::Protocol => "ProtocolError",
            Kind::ConnectionLost => "ConnectionLostError",
            Kind::Authentication => "AuthenticationError",
            Kind::LimitExceeded => "LimitExceededError",
            Kind::ProducerFailed => "ProducerFailedError",
            Kind::Spill => "SpillError",
        }
    }
}

/// The registered classes, indexed by `Kind as usize`.
static CLASSES: PyOnceLock<Vec<Py<PyType>>> = PyOnceLock::new();

/// Registers the exception classes core errors are raised as: a dict from each class's name
/// to the class, every one of them (``creditflow.errors`` calls it once, at import).
#[pyfunction]
pub fn _register_errors(py: Python<'_>, classes: &Bound<'_, PyDict>) -> PyResult<()> {
    let mut table = Vec::with_capacity(Kind::ALL.len());
    for kind in Kind::ALL {
        let name = kind.class_name();
        let cls = classes
            .get_item(name)?
            .ok_or_else(|| PyValueError::new_err(format!("_register_errors: {name} is missing")))?;
        let cls = cls
            .cast_into::<PyType>()
            .map_err(|_| PyTypeError::new_err(format!("_register_errors: {name} is not a class")))?;
        if !cls.is_subclass_of::<pyo3::exceptions::PyException>()? {
            return Err(PyTypeError::new_err(format!(
                "_register_errors: {name} is not an Exception subclass"
            )));
        }
        table.push(cls.unbind());
    }
    if classes.len() != Kind::ALL.len() {
        let known: Vec<&str> = Kind::ALL.iter().map(|k| k.class_name()).collect();
        return Err(PyValueError::new_err(format!(
            "_register_errors: expected exactly {known:?}, got {} classes",
            classes.len()
        )));
    }
    if let Err(table) = CLASSES.set(py, table) {
        // Registered before (e.g. `importlib.reload(creditflow.errors)`): only the same
        // classes again are fine; new ones would make `except cf.ClosedError` miss.
        let registered = CLASSES.get(py).expect("set");
        if registered.iter().zip(&table).any(|(a, b)| !a.is(b)) {
            return Err(PyRuntimeError::new_err(
                "creditflow's exception classes are already registered (creditflow.errors cannot be reloaded)",
            ));
        }
    }
    Ok(())
}

/// An instance of the registered class of `kind`, `cls(message, **kwargs)`.
fn new_err(py: Python<'_>, kind: Kind, message: String, kwargs: Option<&Bound<'_, PyDict>>) -> PyErr {
    let Some(classes) = CLASSES.get(py) else {
        return PyRuntimeError::new_err(format!(
            "{message} (raised as RuntimeError: creditflow.errors has not registered {} with \
             creditflow._native; import creditflow, not creditflow._native alone)",
            kind.class_name()
        ));
    };
    match classes[kind as usize].bind(py).call((message,), kwargs) {
        Ok(exc) => PyErr::from_value(exc),
        Err(e) => e,
    }
}

/// Converts a core error into the matching Python exception.
pub fn to_py(py: Python<'_>, err: Error) -> PyErr {
    let message = err.to_string();
    let kind = match err {
        Error::InsufficientBuffers {
            required,
            available,
            total,
            segment_size,
            ..
        } => {
            let kwargs = PyDict::new(py);
            let set = || -> PyResult<()> {
                kwargs.set_item("required", required)?;
                kwargs.set_item("available", available)?;
                kwargs.set_item("total", total)?;
                kwargs.set_item("segment_size", segment_size)
            };
            if let Err(e) = set() {
                return e;
            }
            return new_err(py, Kind::InsufficientBuffers, message, Some(&kwargs));
        }
        Error::Interrupted => return PyKeyboardInterrupt::new_err(message),
        // Arrow rejects what IPC cannot carry, or a batch it cannot slice/take.
        Error::Arrow(e) => return new_err(py, Kind::InvalidArgument, format!("arrow: {e}"), None),
        Error::PartitionNotFound(_) => Kind::PartitionNotFound,
        Error::PartitionExists(_) | Error::SubpartitionOutOfRange { .. } | Error::InvalidArgument(_) => {
            Kind::InvalidArgument
        }
        Error::AlreadyConsumed { .. } => Kind::AlreadyConsumed,
        Error::SchemaMismatch { .. } => Kind::SchemaMismatch,
        Error::Timeout(..) => Kind::Timeout,
        Error::Closed(_) => Kind::Closed,
        Error::Protocol(_) => Kind::Protocol,
        Error::ConnectionLost(_) => Kind::ConnectionLost,
        Error::Authentication(_) => Kind::Authentication,
        Error::LimitExceeded(_) => Kind::LimitExceeded,
        Error::ProducerFailed(_) => Kind::ProducerFailed,
        Error::Spill(_) => Kind::Spill,
    };
    new_err(py, kind, message, None)
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

#[cfg(test)]
mod tests {
    use super::Kind;

    #[test]
    fn kinds_index_the_table_in_order() {
        for (i, kind) in Kind::ALL.iter().enumerate() {
            assert_eq!(*kind as usize, i, "{kind:?}");
        }
    }
}
