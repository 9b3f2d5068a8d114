//! Which subpartition each row (or batch) goes to (Flink's `ChannelSelector`).

use arrow_array::types::{ByteArrayType, GenericBinaryType, GenericStringType};
use arrow_array::{
    make_array, Array, ArrayRef, GenericByteArray, RecordBatch, RecordBatchOptions, UInt32Array,
};
use arrow_buffer::{ArrowNativeType, Buffer, OffsetBuffer, ScalarBuffer};
use arrow_data::ArrayData;
use arrow_schema::{DataType, Schema};
use arrow_select::take::take;

use crate::base::error::{Error, Result};
use crate::partition::row_order::order_rows;
use crate::partition::spark_hash::{check_key_type, spark_partition_ids};

/// How a [`crate::RecordWriter`] distributes batches over subpartitions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Partitioner {
    /// Row r goes to `pmod(hash(keys...), n)` with Spark SQL's Murmur3 `hash`, so the rows
    /// land where `df.repartition(n, *keys)` puts them.
    Hash(Vec<String>),
    /// Whole batches go to subpartitions in turn.
    RoundRobin,
    /// Every batch goes to every subpartition (sharing its buffers).
    Broadcast,
    /// Every batch goes to subpartition 0 (one-to-one forward; use one subpartition).
    Forward,
}

impl Partitioner {
    /// Checks that this partitioner can distribute batches of `schema`: for a hash
    /// partitioner, that every key column exists at the top level and has a type Spark's hash
    /// takes. The same check runs when a writer sees its first batch; calling it earlier
    /// (e.g. on a Spark driver) fails before any data moves.
    pub fn check_schema(&self, schema: &Schema) -> Result<()> {
        match self {
            Partitioner::Hash(keys) => hash_key_indices(keys, schema).map(drop),
            _ => Ok(()),
        }
    }
}

/// The indices of `keys` in `schema`, after checking that each exists and can be hashed.
fn hash_key_indices(keys: &[String], schema: &Schema) -> Result<Vec<usize>> {
    if keys.is_empty() {
        return Err(Error::InvalidArgument(
            "HashPartitioner needs at least one key column".into(),
        ));
    }
    keys.iter()
        .map(|k| {
            let idx = schema.index_of(k).map_err(|_| {
                let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
                Error::InvalidArgument(format!(
                    "key column {k:?} not in the batch schema; columns are {names:?}"
                ))
            })?;
            check_key_type(schema.field(idx).data_type())
                .map_err(|e| Error::InvalidArgument(format!("key column {k:?}: {e}")))?;
            Ok(idx)
        })
        .collect()
}

/// One piece of a split batch.
#[derive(Debug, Clone)]
pub struct Piece {
    /// Target subpartition.
    pub subpartition: usize,
    /// Its rows.
    pub batch: RecordBatch,
    /// True when the piece is the whole input batch, unchanged (no rows taken out).
    pub whole: bool,
}

impl Piece {
    /// The whole of `batch`, to `subpartition`.
    pub fn whole(subpartition: usize, batch: &RecordBatch) -> Piece {
        Piece {
            subpartition,
            batch: batch.clone(),
            whole: true,
        }
    }
}

/// Where a batch goes, as [`Splitter::route`] says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// The whole batch, unchanged, to each of these subpartitions (none: an empty batch).
    Whole(Vec<usize>),
    /// Its rows by subpartition: [`Splitter::rows`].
    Rows,
}

/// A partitioner bound to a schema, with its scratch space.
pub struct Splitter {
    kind: Partitioner,
    key_indices: Vec<usize>,
    next: usize,
    ids: Vec<u32>,
    counts: Vec<usize>,
    order: Vec<u32>,
    /// Scratch space of [`order_rows`].
    lanes: Vec<usize>,
}

impl Splitter {
    /// Binds `kind` to `schema` (key columns must exist at the top level).
    pub fn new(kind: Partitioner, schema: &Schema) -> Result<Splitter> {
        let key_indices = match &kind {
            Partitioner::Hash(keys) => hash_key_indices(keys, schema)?,
            _ => Vec::new(),
        };
        Ok(Splitter {
            kind,
            key_indices,
            next: 0,
            ids: Vec::new(),
            counts: Vec::new(),
            order: Vec::new(),
            lanes: Vec::new(),
        })
    }

    /// The partitioner.
    pub fn kind(&self) -> &Partitioner {
        &self.kind
    }

    /// Splits `batch` into `(subpartition, rows)` pieces for `n` subpartitions, skipping
    /// empty pieces of a hash split.
    pub fn split(&mut self, batch: &RecordBatch, n: usize) -> Result<Vec<Piece>> {
        match self.route(batch, n)? {
            Route::Whole(to) => Ok(to.into_iter().map(|p| Piece::whole(p, batch)).collect()),
            Route::Rows => self.split_routed(batch, n),
        }
    }

    /// Where `batch`'s rows go among `n` subpartitions, before any is copied: the whole batch
    /// to some, or its rows by subpartition ([`Splitter::rows`], until the next batch).
    pub fn route(&mut self, batch: &RecordBatch, n: usize) -> Result<Route> {
        match &self.kind {
            Partitioner::Forward => Ok(Route::Whole(vec![0])),
            Partitioner::RoundRobin => {
                let i = self.next % n;
                self.next = (i + 1) % n;
                Ok(Route::Whole(vec![i]))
            }
            Partitioner::Broadcast => Ok(Route::Whole((0..n).collect())),
            Partitioner::Hash(_) => self.hash_route(batch, n),
        }
    }

    /// Subpartition `p`'s rows of the batch last routed [`Route::Rows`], in input order.
    pub fn rows(&self, p: usize) -> &[u32] {
        &self.order[self.counts[p]..self.counts[p + 1]]
    }

    fn hash_route(&mut self, batch: &RecordBatch, n: usize) -> Result<Route> {
        let rows = batch.num_rows();
        if rows == 0 {
            return Ok(Route::Whole(Vec::new()));
        }
        let columns: Vec<&dyn arrow_array::Array> = self
            .key_indices
            .iter()
            .map(|&i| batch.column(i).as_ref())
            .collect();
        let n32 = u32::try_from(n).map_err(|_| Error::InvalidArgument("too many subpartitions".into()))?;
        spark_partition_ids(&columns, rows, n32, &mut self.ids)?;
        match order_rows(&self.ids, n, &mut self.counts, &mut self.order, &mut self.lanes) {
            Some(p) => Ok(Route::Whole(vec![p])),
            None => Ok(Route::Rows),
        }
    }

    /// The pieces of the batch last routed [`Route::Rows`] (`batch` is that batch).
    pub fn split_routed(&self, batch: &RecordBatch, n: usize) -> Result<Vec<Piece>> {
        // Columns without nulls of the common types are split in one pass each (the rows of
        // each piece stay in input order); everything else goes through Arrow's `take`.
        let mut columns: Vec<Vec<ArrayRef>> = vec![Vec::with_capacity(batch.num_columns()); n];
        for col in batch.columns() {
            let pieces = match scatter(col, &self.ids, &self.order, &self.counts, n) {
                Some(pieces) => pieces,
                None => (0..n)
                    .map(|p| {
                        let idx = UInt32Array::from(self.order[self.counts[p]..self.counts[p + 1]].to_vec());
                        take(col.as_ref(), &idx, None)
                    })
                    .collect::<std::result::Result<Vec<_>, _>>()?,
            };
            for (p, piece) in pieces.into_iter().enumerate() {
                columns[p].push(piece);
            }
        }
        let mut out = Vec::new();
        for (p, cols) in columns.into_iter().enumerate() {
            let rows = self.counts[p + 1] - self.counts[p];
            if rows == 0 {
                continue;
            }
            let options = RecordBatchOptions::new().with_row_count(Some(rows));
            let piece = RecordBatch::try_new_with_options(batch.schema(), cols, &options)?;
            out.push(Piece {
                subpartition: p,
                batch: piece,
                whole: false,
            });
        }
        Ok(out)
    }
}

/// Splits a column without nulls into `n` pieces by partition id; `None` for columns this fast
/// path does not handle. `order` is the counting sort of the row indices by id, and
/// `offsets[p]..offsets[p + 1]` is piece p's range in it, i.e. `offsets[p + 1] - offsets[p]` rows.
fn scatter(col: &ArrayRef, ids: &[u32], order: &[u32], offsets: &[usize], n: usize) -> Option<Vec<ArrayRef>> {
    if col.null_count() != 0 || col.len() != ids.len() {
        return None;
    }
    let counts: Vec<usize> = (0..n).map(|p| offsets[p + 1] - offsets[p]).collect();
    match col.data_type() {
        DataType::Utf8 => Some(scatter_bytes::<GenericStringType<i32>>(col, ids, &counts)),
        DataType::LargeUtf8 => Some(scatter_bytes::<GenericStringType<i64>>(col, ids, &counts)),
        DataType::Binary => Some(scatter_bytes::<GenericBinaryType<i32>>(col, ids, &counts)),
        DataType::LargeBinary => Some(scatter_bytes::<GenericBinaryType<i64>>(col, ids, &counts)),
        dt if dt.is_primitive() => match dt.primitive_width()? {
            1 => Some(gather_fixed::<u8>(col, order, offsets)),
            2 => Some(gather_fixed::<u16>(col, order, offsets)),
            4 => Some(gather_fixed::<u32>(col, order, offsets)),
            8 => Some(gather_fixed::<u64>(col, order, offsets)),
            16 => Some(gather_fixed::<u128>(col, order, offsets)),
            _ => None,
        },
        _ => None,
    }
}

/// Fixed-width values reinterpreted as `T` (same width), piece by piece: each piece is
/// gathered through its range of `order` into a vector of exactly its length: sequential
/// writes without a capacity check per value, several times faster than pushing each value
/// onto its piece's vector in input order (figures: docs/benchmarks.md, PySpark).
fn gather_fixed<T: ArrowNativeType>(col: &ArrayRef, order: &[u32], offsets: &[usize]) -> Vec<ArrayRef> {
    let data = col.to_data();
    let values: &[T] = &data.buffers()[0].typed_data::<T>()[data.offset()..data.offset() + data.len()];
    offsets
        .windows(2)
        .map(|w| {
            order[w[0]..w[1]]
                .iter()
                .map(|&r| values[r as usize])
                .collect::<Vec<T>>()
        })
        .map(|v| {
            let len = v.len();
            let data = ArrayData::builder(col.data_type().clone())
                .len(len)
                .add_buffer(Buffer::from_vec(v))
                .build()
                .expect("same type and width as a valid input column");
            make_array(data)
        })
        .collect()
}

/// Variable-width values (strings, binary), scattered by id with one pass to size the
/// pieces and one to copy.
fn scatter_bytes<B: ByteArrayType>(col: &ArrayRef, ids: &[u32], counts: &[usize]) -> Vec<ArrayRef> {
    let arr = col
        .as_any()
        .downcast_ref::<GenericByteArray<B>>()
        .expect("checked data type");
    let offs = arr.value_offsets();
    let values = arr.value_data();
    let mut sizes = vec![0usize; counts.len()];
    for (w, &id) in offs.windows(2).zip(ids) {
        sizes[id as usize] += (w[1] - w[0]).as_usize();
    }
    let mut out_vals: Vec<Vec<u8>> = sizes.iter().map(|&s| Vec::with_capacity(s)).collect();
    let mut out_offs: Vec<Vec<B::Offset>> = counts
        .iter()
        .map(|&c| {
            let mut v = Vec::with_capacity(c + 1);
            v.push(B::Offset::usize_as(0));
            v
        })
        .collect();
    for (w, &id) in offs.windows(2).zip(ids) {
        let p = id as usize;
        out_vals[p].extend_from_slice(&values[w[0].as_usize()..w[1].as_usize()]);
        out_offs[p].push(B::Offset::usize_as(out_vals[p].len()));
    }
    out_offs
        .into_iter()
        .zip(out_vals)
        .map(|(o, v)| {
            let offsets = OffsetBuffer::new(ScalarBuffer::from(o));
            // SAFETY: each value is copied whole from a valid array of the same type, so the
            // offsets are monotonic and in bounds and, for strings, every value is UTF-8.
            let piece = unsafe { GenericByteArray::<B>::new_unchecked(offsets, Buffer::from_vec(v), None) };
            std::sync::Arc::new(piece) as ArrayRef
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{ArrayRef, Int64Array};
    use std::sync::Arc;

    fn batch(n: i64) -> RecordBatch {
        let k: ArrayRef = Arc::new(Int64Array::from_iter_values(0..n));
        let v: ArrayRef = Arc::new(Int64Array::from_iter_values((0..n).map(|i| i * 10)));
        RecordBatch::try_from_iter([("k", k), ("v", v)]).unwrap()
    }

    #[test]
    fn hash_split_keeps_every_row_once_and_in_order() {
        let b = batch(1000);
        let mut s = Splitter::new(Partitioner::Hash(vec!["k".into()]), &b.schema()).unwrap();
        let parts = s.split(&b, 4).unwrap();
        let total: usize = parts.iter().map(|p| p.batch.num_rows()).sum();
        assert_eq!(total, 1000);
        let mut ids = Vec::new();
        spark_partition_ids(&[b.column(0).as_ref()], 1000, 4, &mut ids).unwrap();
        for Piece {
            subpartition: p,
            batch: piece,
            ..
        } in &parts
        {
            let keys = piece.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
            let keys: Vec<i64> = keys.values().to_vec();
            assert!(
                keys.windows(2).all(|w| w[0] < w[1]),
                "row order kept within a piece"
            );
            assert!(keys.iter().all(|&k| ids[k as usize] as usize == *p));
            // The rows the route named are the piece's (key k is row k).
            let named: Vec<i64> = s.rows(*p).iter().map(|&r| r as i64).collect();
            assert_eq!(named, keys);
        }
        assert_eq!(s.route(&b.slice(0, 0), 4).unwrap(), Route::Whole(vec![]));
        let one_key =
            RecordBatch::try_from_iter([("k", Arc::new(Int64Array::from(vec![7; 5])) as ArrayRef)]).unwrap();
        let mut one = Splitter::new(Partitioner::Hash(vec!["k".into()]), &one_key.schema()).unwrap();
        assert!(matches!(one.route(&one_key, 4).unwrap(), Route::Whole(to) if to.len() == 1));
    }

    #[test]
    fn scatter_matches_take_for_every_fast_path_type_and_sliced_input() {
        use arrow_array::{BinaryArray, Float32Array, Int16Array, Int8Array, LargeStringArray, StringArray};
        let n = 500;
        let cols: Vec<(&str, ArrayRef)> = vec![
            ("k", Arc::new(Int64Array::from_iter_values(0..n))),
            (
                "i8",
                Arc::new(Int8Array::from_iter_values((0..n).map(|i| i as i8))),
            ),
            (
                "i16",
                Arc::new(Int16Array::from_iter_values((0..n).map(|i| i as i16))),
            ),
            (
                "f32",
                Arc::new(Float32Array::from_iter_values((0..n).map(|i| i as f32 * 0.5))),
            ),
            (
                "s",
                Arc::new(StringArray::from_iter_values(
                    (0..n).map(|i| "é".repeat(i as usize % 5)),
                )),
            ),
            (
                "ls",
                Arc::new(LargeStringArray::from_iter_values(
                    (0..n).map(|i| format!("v{i}")),
                )),
            ),
            (
                "b",
                Arc::new(BinaryArray::from_iter_values(
                    (0..n).map(|i| vec![i as u8; i as usize % 3]),
                )),
            ),
            (
                "nullable",
                Arc::new(Int64Array::from_iter((0..n).map(|i| (i % 7 != 0).then_some(i)))),
            ),
        ];
        let full = RecordBatch::try_from_iter(cols).unwrap();
        for b in [full.clone(), full.slice(13, 300)] {
            let mut s = Splitter::new(Partitioner::Hash(vec!["k".into()]), &b.schema()).unwrap();
            let parts = s.split(&b, 4).unwrap();
            let mut ids = Vec::new();
            spark_partition_ids(&[b.column(0).as_ref()], b.num_rows(), 4, &mut ids).unwrap();
            for piece in &parts {
                let idx: Vec<u32> = (0..b.num_rows() as u32)
                    .filter(|&r| ids[r as usize] as usize == piece.subpartition)
                    .collect();
                let want = arrow_select::take::take_record_batch(&b, &UInt32Array::from(idx)).unwrap();
                assert_eq!(piece.batch, want);
            }
        }
    }

    #[test]
    fn unknown_key_column_is_a_clear_error() {
        let b = batch(3);
        let err = Splitter::new(Partitioner::Hash(vec!["nope".into()]), &b.schema())
            .err()
            .unwrap();
        assert!(err.to_string().contains("\"nope\""), "{err}");
        assert!(err.to_string().contains("\"k\""), "{err}");
    }

    #[test]
    fn round_robin_rotates_and_broadcast_copies() {
        let b = batch(3);
        let mut rr = Splitter::new(Partitioner::RoundRobin, &b.schema()).unwrap();
        let targets: Vec<usize> = (0..5).map(|_| rr.split(&b, 3).unwrap()[0].subpartition).collect();
        assert_eq!(targets, vec![0, 1, 2, 0, 1]);
        let mut bc = Splitter::new(Partitioner::Broadcast, &b.schema()).unwrap();
        assert_eq!(bc.split(&b, 3).unwrap().len(), 3);
    }

    #[test]
    fn check_schema_rejects_unhashable_key_types_before_any_batch() {
        use arrow_schema::{Field, Fields};
        let list = DataType::List(Arc::new(Field::new("item", DataType::Int64, true)));
        let schema = Schema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new("l", list, true),
            Field::new("u", DataType::UInt32, true),
            Field::new(
                "s",
                DataType::Struct(Fields::from(vec![Field::new("a", DataType::Utf8, true)])),
                true,
            ),
        ]);
        let hash = |keys: &[&str]| Partitioner::Hash(keys.iter().map(|k| k.to_string()).collect());
        hash(&["k", "s"]).check_schema(&schema).unwrap();
        let err = hash(&["k", "l"]).check_schema(&schema).unwrap_err().to_string();
        assert!(err.contains("key column \"l\"") && err.contains("List"), "{err}");
        let err = hash(&["u"]).check_schema(&schema).unwrap_err().to_string();
        assert!(err.contains("unsigned"), "{err}");
        assert!(hash(&[]).check_schema(&schema).is_err());
        // The writer's splitter runs the same check when it binds to the first batch.
        assert!(Splitter::new(hash(&["l"]), &schema).is_err());
        Partitioner::RoundRobin.check_schema(&schema).unwrap();
    }
}
