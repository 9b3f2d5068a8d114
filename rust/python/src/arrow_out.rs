//! Record batches out to Python as `pyarrow.RecordBatch` through the Arrow C data interface,
//! and the token that hands a batch written in this process back as the object written.
//!
//! A gate's batches mostly share one schema. A [`BatchExporter`] keeps the `pyarrow.Schema`
//! it made last and hands pyarrow only each batch's arrays with it: importing a C schema
//! again for every batch (names, types, metadata) was a good part of a small batch's import.

use std::sync::{Arc, Mutex};

use arrow_array::ffi::FFI_ArrowArray;
use arrow_array::{Array, RecordBatch, StructArray};
use arrow_schema::SchemaRef;
use creditflow_core::partition::subpartition::Token;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

/// `pyarrow.RecordBatch` and its `_import_from_c`, looked up once.
static PA_RECORD_BATCH: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
static PA_IMPORT_BATCH: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// The original Python batch object, carried with a batch handed over in-process.
struct PyToken(Py<PyAny>);

/// Whether `data` is exactly a `pyarrow.RecordBatch` (what a gate returns).
pub(crate) fn is_pyarrow_batch(data: &Bound<'_, PyAny>) -> PyResult<bool> {
    let cls = PA_RECORD_BATCH.import(data.py(), "pyarrow", "RecordBatch")?;
    Ok(data.get_type().is(cls))
}

/// The token of `data`, a `pyarrow.RecordBatch` ([`is_pyarrow_batch`]): a local reader gets the
/// object itself back.
pub(crate) fn token_for(data: &Bound<'_, PyAny>) -> Token {
    Arc::new(PyToken(data.clone().unbind()))
}

/// Converts a gate's batches to `pyarrow.RecordBatch`, the schema made once while it stays
/// the same (one per gate).
#[derive(Default)]
pub(crate) struct BatchExporter {
    /// Locked only to look at or replace the pair, never across a call into Python (which can
    /// let another thread of the same gate run and ask for the lock while holding the GIL).
    last: Mutex<Option<(SchemaRef, Py<PyAny>)>>,
}

impl BatchExporter {
    /// `batch` as a `pyarrow.RecordBatch`: the object written, when `token` carries it.
    pub(crate) fn export(
        &self,
        py: Python<'_>,
        batch: RecordBatch,
        token: Option<Token>,
    ) -> PyResult<Py<PyAny>> {
        if let Some(t) = token.as_ref().and_then(|t| t.downcast_ref::<PyToken>()) {
            return Ok(t.0.clone_ref(py));
        }
        let py_schema = self.schema(py, batch.schema())?;
        let mut array = Box::new(FFI_ArrowArray::new(&StructArray::from(batch).into_data()));
        let import = PA_IMPORT_BATCH.get_or_try_init(py, || -> PyResult<Py<PyAny>> {
            Ok(PA_RECORD_BATCH
                .import(py, "pyarrow", "RecordBatch")?
                .getattr("_import_from_c")?
                .unbind())
        })?;
        // pyarrow moves the array out of `array` (leaving it released) and owns it from then
        // on; if it fails before that, dropping `array` releases it here.
        let address = std::ptr::from_mut::<FFI_ArrowArray>(&mut *array) as usize;
        Ok(import.bind(py).call1((address, py_schema))?.unbind())
    }

    /// The `pyarrow.Schema` of `schema`: the one made last if it describes the same.
    fn schema(&self, py: Python<'_>, schema: SchemaRef) -> PyResult<Py<PyAny>> {
        if let Some((last, made)) = self.last.lock().unwrap().as_ref() {
            if Arc::ptr_eq(last, &schema) || **last == *schema {
                return Ok(made.clone_ref(py));
            }
        }
        let made = pyo3_arrow::PySchema::new(schema.clone())
            .into_pyarrow(py)?
            .unbind();
        *self.last.lock().unwrap() = Some((schema, made.clone_ref(py)));
        Ok(made)
    }
}
