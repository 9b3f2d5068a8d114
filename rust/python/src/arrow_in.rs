//! Record batches in from Python through the Arrow PyCapsule interface (`__arrow_c_array__`),
//! with the schema imported once per writer.
//!
//! Importing a C schema allocates a field per column (names, metadata, the schema itself);
//! for a stream of small batches that is a good part of a write. A [`BatchImporter`] keeps the
//! schema it imported last and the C schema it came from, in a compact form; a batch whose C
//! schema describes the same (the same formats, names, flags and metadata, compared in place,
//! without allocating) reuses it, and only its arrays are imported.
//!
//! A `pyarrow.RecordBatch` whose schema equals (metadata included) the one its writer imported
//! last from pyarrow is not asked for its C schema at all: pyarrow exports only its arrays
//! (`_export_to_c`), since exporting the schema (a string per name and format) and comparing
//! it cost as much again as exporting the arrays.

use std::ffi::CStr;
use std::os::raw::c_char;
use std::sync::Mutex;

use arrow_array::ffi::{from_ffi_and_data_type, FFI_ArrowArray, FFI_ArrowSchema};
use arrow_array::{Array, RecordBatch, RecordBatchOptions, StructArray};
use arrow_schema::{DataType, Field, SchemaBuilder, SchemaRef};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyTuple};

const SCHEMA_CAPSULE: &CStr = c"arrow_schema";
const ARRAY_CAPSULE: &CStr = c"arrow_array";

/// A writer's last imported schema: the batches' schema, their struct type, and the C schema
/// it was imported from, flattened (see [`visit`]); and the `pyarrow.Schema` it was imported
/// from when that batch was a `pyarrow.RecordBatch`.
pub(crate) struct BatchImporter {
    last: Option<(Vec<u8>, SchemaRef, DataType)>,
    last_pyarrow: Option<Py<PyAny>>,
}

/// Walks a C schema depth first, handing each piece of what it describes to `f` (format,
/// name, flags, metadata, the number of children, whether there is a dictionary), so that two
/// schemas describe the same exactly when they hand over the same bytes. Stops early when `f`
/// returns false; returns false then.
///
/// # Safety
/// `schema` must be a valid C schema (the Arrow C data interface), not yet released.
unsafe fn visit(schema: &FFI_ArrowSchema, f: &mut impl FnMut(&[u8]) -> bool) -> bool {
    // SAFETY: the pointers of a valid C schema are null or point at what the interface says.
    unsafe {
        let n_children = usize::try_from(schema.n_children).unwrap_or(0);
        let ok = f(cstr(schema.format))
            && f(&[0])
            && f(cstr(schema.name))
            && f(&[0])
            && f(&schema.flags.to_ne_bytes())
            && f(metadata(schema.metadata))
            && f(&(n_children as u64).to_ne_bytes())
            && f(&[u8::from(!schema.dictionary.is_null())]);
        if !ok {
            return false;
        }
        for i in 0..n_children {
            let child = *schema.children.add(i);
            if child.is_null() || !visit(&*child, f) {
                return false;
            }
        }
        schema.dictionary.is_null() || visit(&*schema.dictionary, f)
    }
}

/// The bytes of a C string (empty for null).
///
/// # Safety
/// `p` is null or a valid null-terminated string.
unsafe fn cstr<'a>(p: *const c_char) -> &'a [u8] {
    if p.is_null() {
        return &[];
    }
    // SAFETY: the caller's promise.
    unsafe { CStr::from_ptr(p).to_bytes() }
}

/// The bytes of a C schema's metadata (empty for null): an int32 count of pairs, then each key
/// and value as an int32 length and that many bytes, in native byte order.
///
/// # Safety
/// `p` is null or valid metadata as the interface describes it.
unsafe fn metadata<'a>(p: *const c_char) -> &'a [u8] {
    if p.is_null() {
        return &[];
    }
    // SAFETY: the caller's promise: every length read lies within the encoded metadata.
    unsafe {
        let base = p.cast::<u8>();
        let read_i32 =
            |at: usize| i32::from_ne_bytes(std::ptr::read_unaligned(base.add(at).cast::<[u8; 4]>()));
        let pairs = usize::try_from(read_i32(0)).unwrap_or(0);
        let mut at = 4;
        for _ in 0..2 * pairs {
            at += 4 + usize::try_from(read_i32(at)).unwrap_or(0);
        }
        std::slice::from_raw_parts(base, at)
    }
}

impl BatchImporter {
    pub(crate) fn new() -> BatchImporter {
        BatchImporter {
            last: None,
            last_pyarrow: None,
        }
    }

    /// The record batch `data` holds, or `None` if it has no `__arrow_c_array__` (a stream);
    /// `pyarrow`: `data` is a `pyarrow.RecordBatch`
    /// ([`is_pyarrow_batch`](crate::arrow_out::is_pyarrow_batch)). The importer is locked only
    /// between calls into Python: pyarrow lets go of the GIL while it exports, and another
    /// thread writing with the same writer may take it meanwhile.
    pub(crate) fn import(
        importer: &Mutex<BatchImporter>,
        data: &Bound<'_, PyAny>,
        pyarrow: bool,
    ) -> PyResult<Option<RecordBatch>> {
        let py = data.py();
        if !pyarrow {
            let Some((schema, array)) = BatchImporter::capsules(data)? else {
                return Ok(None);
            };
            return importer.lock().unwrap().batch(&schema, &array).map(Some);
        }
        let py_schema = data.getattr(intern!(py, "schema"))?;
        let known = importer.lock().unwrap().last_of_pyarrow(py);
        if let Some((last, schema, data_type)) = known {
            let same = last.bind(py).is(&py_schema)
                || last
                    .bind(py)
                    .call_method1(intern!(py, "equals"), (&py_schema, true))?
                    .is_truthy()?;
            if same {
                return arrays_of(data, schema, data_type).map(Some);
            }
        }
        let (schema, array) = BatchImporter::capsules(data)?.expect("a pyarrow.RecordBatch exports capsules");
        let mut imp = importer.lock().unwrap();
        let batch = imp.batch(&schema, &array)?;
        // Set under the same lock as the schema it stands for.
        let before = imp.last_pyarrow.replace(py_schema.unbind());
        drop(imp);
        drop(before);
        Ok(Some(batch))
    }

    /// The `pyarrow.Schema` last imported, with the schema and struct type imported from it.
    fn last_of_pyarrow(&self, py: Python<'_>) -> Option<(Py<PyAny>, SchemaRef, DataType)> {
        let (_, schema, data_type) = self.last.as_ref()?;
        let last = self.last_pyarrow.as_ref()?;
        Some((last.clone_ref(py), schema.clone(), data_type.clone()))
    }

    /// The object's `__arrow_c_array__` capsules, or `None` if it has no such method.
    fn capsules<'py>(
        data: &Bound<'py, PyAny>,
    ) -> PyResult<Option<(Bound<'py, PyCapsule>, Bound<'py, PyCapsule>)>> {
        let Ok(method) = data.getattr(intern!(data.py(), "__arrow_c_array__")) else {
            return Ok(None);
        };
        let tuple = method.call0()?;
        let tuple = tuple
            .cast::<PyTuple>()
            .map_err(|_| PyTypeError::new_err("__arrow_c_array__ must return a tuple (schema, array)"))?;
        Ok(Some((
            tuple.get_item(0)?.cast_into()?,
            tuple.get_item(1)?.cast_into()?,
        )))
    }

    /// The record batch the two capsules hold: a struct array without nulls, its fields the
    /// columns. Takes the array out of its capsule (which is left released).
    fn batch(
        &mut self,
        schema: &Bound<'_, PyCapsule>,
        array: &Bound<'_, PyCapsule>,
    ) -> PyResult<RecordBatch> {
        let schema_ptr = schema
            .pointer_checked(Some(SCHEMA_CAPSULE))?
            .cast::<FFI_ArrowSchema>();
        let array_ptr = array
            .pointer_checked(Some(ARRAY_CAPSULE))?
            .cast::<FFI_ArrowArray>();
        // SAFETY: a capsule named "arrow_schema" holds a C schema its producer keeps alive (and
        // releases) with the capsule, which we hold.
        let c_schema = unsafe { schema_ptr.as_ref() };
        let (schema, data_type) = self.schema(c_schema)?;
        // SAFETY: a capsule named "arrow_array" holds a C array; `from_raw` moves it out and
        // leaves a released one behind, so the capsule's destructor does not release it twice.
        let c_array = unsafe { FFI_ArrowArray::from_raw(array_ptr.as_ptr()) };
        // SAFETY: the array was exported together with this schema, which describes `data_type`.
        let data = unsafe { from_ffi_and_data_type(c_array, data_type) }
            .map_err(|e| PyValueError::new_err(format!("invalid Arrow array: {e}")))?;
        record_batch(schema, StructArray::from(data))
    }

    /// The schema and struct type `c_schema` describes: the last ones if it describes the same.
    fn schema(&mut self, c_schema: &FFI_ArrowSchema) -> PyResult<(SchemaRef, DataType)> {
        if let Some((flat, schema, data_type)) = &self.last {
            let mut at = 0;
            // SAFETY: a capsule's C schema is valid until the capsule goes.
            let same = unsafe {
                visit(c_schema, &mut |piece| {
                    let ok = flat.get(at..at + piece.len()) == Some(piece);
                    at += piece.len();
                    ok
                })
            } && at == flat.len();
            if same {
                return Ok((schema.clone(), data_type.clone()));
            }
        }
        let field = Field::try_from(c_schema)
            .map_err(|e| PyValueError::new_err(format!("invalid Arrow schema: {e}")))?;
        let DataType::Struct(fields) = field.data_type() else {
            return Err(PyValueError::new_err(format!(
                "expected a record batch (a struct array), got an array of {}",
                field.data_type()
            )));
        };
        let schema = SchemaRef::new(
            SchemaBuilder::from(fields)
                .finish()
                .with_metadata(field.metadata().clone()),
        );
        let mut flat = Vec::new();
        // SAFETY: as above.
        unsafe {
            visit(c_schema, &mut |piece| {
                flat.extend_from_slice(piece);
                true
            })
        };
        let data_type = field.data_type().clone();
        self.last = Some((flat, schema.clone(), data_type.clone()));
        self.last_pyarrow = None;
        Ok((schema, data_type))
    }
}

/// A `pyarrow.RecordBatch` whose schema equals the one `schema` and `data_type` were imported
/// from: only its arrays are exported.
fn arrays_of(data: &Bound<'_, PyAny>, schema: SchemaRef, data_type: DataType) -> PyResult<RecordBatch> {
    let mut c_array = Box::new(FFI_ArrowArray::empty());
    let address = std::ptr::from_mut::<FFI_ArrowArray>(&mut *c_array) as usize;
    // pyarrow writes the exported struct array into `c_array`; if it fails before that,
    // `c_array` stays empty (released) and dropping it releases nothing.
    data.call_method1(intern!(data.py(), "_export_to_c"), (address,))?;
    // SAFETY: pyarrow exported the batch as a struct array of its schema, which equals the
    // schema `data_type` was imported from.
    let array_data = unsafe { from_ffi_and_data_type(*c_array, data_type) }
        .map_err(|e| PyValueError::new_err(format!("invalid Arrow array: {e}")))?;
    record_batch(schema, StructArray::from(array_data))
}

/// The struct array as a record batch of `schema`: its fields are the columns.
fn record_batch(schema: SchemaRef, array: StructArray) -> PyResult<RecordBatch> {
    if array.null_count() != 0 {
        return Err(PyValueError::new_err(
            "a struct array with nulls is not a record batch",
        ));
    }
    let options = RecordBatchOptions::new().with_row_count(Some(array.len()));
    let (_, columns, _) = array.into_parts();
    RecordBatch::try_new_with_options(schema, columns, &options)
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;

    use arrow_array::{Int64Array, StringArray};
    use arrow_schema::Schema;

    use super::*;

    fn flat(schema: &Schema) -> Vec<u8> {
        let c = FFI_ArrowSchema::try_from(schema).unwrap();
        let mut out = Vec::new();
        // SAFETY: a schema just exported.
        unsafe {
            visit(&c, &mut |p| {
                out.extend_from_slice(p);
                true
            })
        };
        out
    }

    #[test]
    fn schemas_flatten_equal_exactly_when_they_describe_the_same() {
        let a = Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("s", DataType::Utf8, true),
        ]);
        assert_eq!(flat(&a), flat(&a.clone()));
        let renamed = Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("t", DataType::Utf8, true),
        ]);
        let retyped = Schema::new(vec![
            Field::new("k", DataType::Int32, false),
            Field::new("s", DataType::Utf8, true),
        ]);
        let nullable = Schema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new("s", DataType::Utf8, true),
        ]);
        let meta = a
            .clone()
            .with_metadata(HashMap::from([("x".to_string(), "1".to_string())]));
        let meta2 = a
            .clone()
            .with_metadata(HashMap::from([("x".to_string(), "2".to_string())]));
        for other in [&renamed, &retyped, &nullable, &meta] {
            assert_ne!(flat(&a), flat(other), "{other:?}");
        }
        assert_ne!(flat(&meta), flat(&meta2));
    }

    #[test]
    fn a_repeated_schema_is_reused_and_a_new_one_imported() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("s", DataType::Utf8, true),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from(vec![1, 2])),
                Arc::new(StringArray::from(vec![Some("a"), None])),
            ],
        )
        .unwrap();
        let mut importer = BatchImporter::new();
        let c = FFI_ArrowSchema::try_from(schema.as_ref()).unwrap();
        // The struct type of a batch: what `__arrow_c_array__` exports.
        let c_struct = FFI_ArrowSchema::try_from(&DataType::Struct(schema.fields().clone())).unwrap();
        assert!(
            importer.schema(&c).is_ok(),
            "a schema is a struct in the C interface"
        );
        let (first, _) = importer.schema(&c_struct).unwrap();
        let (again, _) = importer.schema(&c_struct).unwrap();
        assert!(Arc::ptr_eq(&first, &again), "the same schema is imported once");
        assert_eq!(first.fields(), batch.schema().fields());
        let other = Schema::new(vec![Field::new("k", DataType::Int64, false)]);
        let c_other = FFI_ArrowSchema::try_from(&DataType::Struct(other.fields().clone())).unwrap();
        let (third, _) = importer.schema(&c_other).unwrap();
        assert_eq!(third.fields().len(), 1);
        let not_struct = FFI_ArrowSchema::try_from(&DataType::Int64).unwrap();
        assert!(BatchImporter::new().schema(&not_struct).is_err());
    }
}
