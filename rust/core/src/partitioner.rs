//! Which subpartition each row (or batch) goes to (Flink's `ChannelSelector`).

use arrow_array::{RecordBatch, UInt32Array};
use arrow_schema::Schema;
use arrow_select::take::take_record_batch;

use crate::error::{Error, Result};
use crate::hash::spark_partition_ids;

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
    fn whole(subpartition: usize, batch: &RecordBatch) -> Piece {
        Piece {
            subpartition,
            batch: batch.clone(),
            whole: true,
        }
    }
}

/// A partitioner bound to a schema, with its scratch space.
pub struct Splitter {
    kind: Partitioner,
    key_indices: Vec<usize>,
    next: usize,
    ids: Vec<u32>,
    counts: Vec<usize>,
    order: Vec<u32>,
}

impl Splitter {
    /// Binds `kind` to `schema` (key columns must exist at the top level).
    pub fn new(kind: Partitioner, schema: &Schema) -> Result<Splitter> {
        let key_indices = match &kind {
            Partitioner::Hash(keys) => {
                if keys.is_empty() {
                    return Err(Error::InvalidArgument(
                        "HashPartitioner needs at least one key column".into(),
                    ));
                }
                keys.iter()
                    .map(|k| {
                        schema.index_of(k).map_err(|_| {
                            let names: Vec<&str> =
                                schema.fields().iter().map(|f| f.name().as_str()).collect();
                            Error::InvalidArgument(format!(
                                "key column {k:?} not in the batch schema; columns are {names:?}"
                            ))
                        })
                    })
                    .collect::<Result<Vec<_>>>()?
            }
            _ => Vec::new(),
        };
        Ok(Splitter {
            kind,
            key_indices,
            next: 0,
            ids: Vec::new(),
            counts: Vec::new(),
            order: Vec::new(),
        })
    }

    /// The partitioner.
    pub fn kind(&self) -> &Partitioner {
        &self.kind
    }

    /// Splits `batch` into `(subpartition, rows)` pieces for `n` subpartitions, skipping
    /// empty pieces of a hash split.
    pub fn split(&mut self, batch: &RecordBatch, n: usize) -> Result<Vec<Piece>> {
        match &self.kind {
            Partitioner::Forward => Ok(vec![Piece::whole(0, batch)]),
            Partitioner::RoundRobin => {
                let i = self.next % n;
                self.next = (i + 1) % n;
                Ok(vec![Piece::whole(i, batch)])
            }
            Partitioner::Broadcast => Ok((0..n).map(|i| Piece::whole(i, batch)).collect()),
            Partitioner::Hash(_) => self.hash_split(batch, n),
        }
    }

    fn hash_split(&mut self, batch: &RecordBatch, n: usize) -> Result<Vec<Piece>> {
        let rows = batch.num_rows();
        if rows == 0 {
            return Ok(Vec::new());
        }
        let columns: Vec<&dyn arrow_array::Array> = self
            .key_indices
            .iter()
            .map(|&i| batch.column(i).as_ref())
            .collect();
        let n32 = u32::try_from(n).map_err(|_| Error::InvalidArgument("too many subpartitions".into()))?;
        spark_partition_ids(&columns, rows, n32, &mut self.ids)?;
        // Counting sort of row indices by target.
        self.counts.clear();
        self.counts.resize(n + 1, 0);
        for &id in &self.ids {
            self.counts[id as usize + 1] += 1;
        }
        if let Some(p) = self.counts.iter().position(|&c| c == rows) {
            return Ok(vec![Piece::whole(p - 1, batch)]);
        }
        for i in 1..=n {
            self.counts[i] += self.counts[i - 1];
        }
        self.order.clear();
        self.order.resize(rows, 0);
        let mut cursor = self.counts.clone();
        for (row, &id) in self.ids.iter().enumerate() {
            let slot = &mut cursor[id as usize];
            self.order[*slot] = row as u32;
            *slot += 1;
        }
        let mut out = Vec::new();
        for p in 0..n {
            let (lo, hi) = (self.counts[p], self.counts[p + 1]);
            if lo == hi {
                continue;
            }
            let idx = UInt32Array::from(self.order[lo..hi].to_vec());
            out.push(Piece {
                subpartition: p,
                batch: take_record_batch(batch, &idx)?,
                whole: false,
            });
        }
        Ok(out)
    }
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
}
