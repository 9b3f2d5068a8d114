//! Record batches out to Python as `pyarrow.RecordBatch` through the Arrow C data interface,
//! and the token that hands a batch written in this process back as the object written.

use std::sync::Arc;

use arrow_array::{RecordBatch, StructArray};
use arrow_schema::Field;
use creditflow_core::partition::subpartition::Token;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

/// `pyarrow.RecordBatch` and its `_import_from_c_capsule`, looked up once.
static PA_RECORD_BATCH: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
static PA_IMPORT_BATCH: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// The original Python batch object, carried with a batch handed over in-process.
struct PyToken(Py<PyAny>);

/// A token for `data` if it is exactly a `pyarrow.RecordBatch` (what a gate returns).
pub(crate) fn token_for(py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<Option<Token>> {
    let cls = PA_RECORD_BATCH.import(py, "pyarrow", "RecordBatch")?;
    if data.get_type().is(cls) {
        Ok(Some(Arc::new(PyToken(data.clone().unbind()))))
    } else {
        Ok(None)
    }
}

/// Converts a batch to `pyarrow.RecordBatch` through the Arrow C data interface.
pub(crate) fn to_pyarrow(py: Python<'_>, batch: RecordBatch, token: Option<Token>) -> PyResult<Py<PyAny>> {
    if let Some(t) = token.as_ref().and_then(|t| t.downcast_ref::<PyToken>()) {
        return Ok(t.0.clone_ref(py));
    }
    let schema = batch.schema();
    let field =
        Field::new_struct("", schema.fields().clone(), false).with_metadata(schema.metadata().clone());
    let array = StructArray::from(batch);
    let capsules = pyo3_arrow::ffi::to_array_pycapsules(py, field.into(), &array, None)?;
    let import = PA_IMPORT_BATCH.get_or_try_init(py, || -> PyResult<Py<PyAny>> {
        Ok(PA_RECORD_BATCH
            .import(py, "pyarrow", "RecordBatch")?
            .getattr("_import_from_c_capsule")?
            .unbind())
    })?;
    Ok(import.bind(py).call1(capsules)?.unbind())
}
