//! [`SparkHasher`]: Spark's `hash(columns...)` over the key columns of a batch, column after
//! column, and the partition of each row (`pmod(hash, n)`); [`spark_hash`] and
//! [`spark_partition_ids`] are one-shot wrappers.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::Array;
use arrow_buffer::NullBuffer;
use arrow_schema::DataType;

use super::columns::{drive, IntCol, RowHash};
use super::dispatch::{check_key_type, dispatch, Apply, ApplyGather};
use super::murmur3::SPARK_HASH_SEED;
use crate::base::error::Error;

/// Reusable scratch space for hashing many batches without reallocating.
///
/// [`spark_hash`] and [`spark_partition_ids`] are convenience wrappers that use a fresh one.
#[derive(Debug, Default)]
pub struct SparkHasher {
    /// Running hashes of the current batch.
    hashes: Vec<i32>,
    /// Hashes of a dictionary's values (seed 42), reused across dictionary columns.
    dict_hashes: Vec<i32>,
}

/// State carried across the key columns of one batch.
pub(super) struct Running<'a> {
    out: &'a mut [i32],
    /// Every entry of `out` is still the seed (nothing hashed yet), so a dictionary's values can be
    /// hashed once and gathered.
    all_seed: bool,
    dict_hashes: &'a mut Vec<i32>,
}

impl SparkHasher {
    /// A hasher with empty scratch space.
    pub fn new() -> Self {
        Self::default()
    }

    /// Spark's `hash(columns...)` for each of the `num_rows` rows, as a slice valid until the
    /// next call. See [`spark_hash`].
    pub fn hash(&mut self, columns: &[&dyn Array], num_rows: usize) -> Result<&[i32], Error> {
        let mut hashes = std::mem::take(&mut self.hashes);
        let result = self.hash_into(columns, num_rows, &mut hashes);
        self.hashes = hashes;
        result.map(|()| self.hashes.as_slice())
    }

    /// Spark's `hash(columns...)` into `out`, resized to `num_rows`. See [`spark_hash`].
    pub fn hash_into(
        &mut self,
        columns: &[&dyn Array],
        num_rows: usize,
        out: &mut Vec<i32>,
    ) -> Result<(), Error> {
        for (i, c) in columns.iter().enumerate() {
            if c.len() != num_rows {
                return Err(Error::InvalidArgument(format!(
                    "key column {i} has {} rows, the batch has {num_rows}",
                    c.len()
                )));
            }
            check_key_type(c.data_type())?;
        }
        out.clear();
        out.resize(num_rows, SPARK_HASH_SEED);
        let mut running = Running {
            out,
            all_seed: true,
            dict_hashes: &mut self.dict_hashes,
        };
        for c in columns {
            hash_column(*c, None, &mut running)?;
        }
        Ok(())
    }

    /// Spark's `pmod(hash(columns...), n)` for each row into `out` (resized to `num_rows`): the
    /// partition `df.repartition(n, *columns)` sends the row to. See [`spark_partition_ids`].
    pub fn partition_ids(
        &mut self,
        columns: &[&dyn Array],
        num_rows: usize,
        n: u32,
        out: &mut Vec<u32>,
    ) -> Result<(), Error> {
        let pmod = Pmod::new(n)?;
        let hashes = self.hash(columns, num_rows)?;
        out.clear();
        out.extend(hashes.iter().map(|&h| pmod.apply(h)));
        Ok(())
    }
}

/// Hashes one key column (or struct field) into the running hashes. `parent` masks rows whose
/// enclosing struct is null.
pub(super) fn hash_column(
    array: &dyn Array,
    parent: Option<&NullBuffer>,
    st: &mut Running<'_>,
) -> Result<(), Error> {
    let own = array.logical_nulls();
    let nulls = NullBuffer::union(parent, own.as_ref());
    if array.is_empty() || nulls.as_ref().is_some_and(|n| n.null_count() == n.len()) {
        return Ok(()); // every value null: the running hash is unchanged
    }
    match array.data_type() {
        DataType::Struct(_) => {
            for child in array.as_struct().columns() {
                hash_column(child.as_ref(), nulls.as_ref(), st)?;
            }
            return Ok(());
        }
        DataType::Dictionary(..) => {
            let dict = array.as_any_dictionary();
            let values: &Arc<dyn Array> = dict.values();
            if values.is_empty() {
                return Err(Error::InvalidArgument(
                    "dictionary key column has non-null keys but no values".into(),
                ));
            }
            let keys = dict.normalized_keys();
            if st.all_seed && values.len() < array.len() {
                // Every running hash is the seed: hash each distinct value once, then gather.
                let dh = &mut *st.dict_hashes;
                dh.clear();
                dh.resize(values.len(), SPARK_HASH_SEED);
                dispatch(values.as_ref(), Apply { nulls: None, out: dh })?;
                let dh = &*dh;
                let gathered = IntCol {
                    values: &keys,
                    f: |k: usize| dh[k],
                };
                drive_copy(&gathered, nulls.as_ref(), st.out);
            } else {
                dispatch(
                    values.as_ref(),
                    ApplyGather {
                        keys: &keys,
                        nulls: nulls.as_ref(),
                        out: st.out,
                    },
                )?;
            }
        }
        _ => dispatch(
            array,
            Apply {
                nulls: nulls.as_ref(),
                out: st.out,
            },
        )?,
    }
    st.all_seed = false;
    Ok(())
}

/// Writes `f(keys[i])` (the precomputed hash) into every valid row.
pub(super) fn drive_copy<F: Fn(usize) -> i32>(
    src: &IntCol<'_, usize, F>,
    nulls: Option<&NullBuffer>,
    out: &mut [i32],
) {
    struct Copy<'a, 'b, F>(&'b IntCol<'a, usize, F>);
    impl<F: Fn(usize) -> i32> RowHash for Copy<'_, '_, F> {
        const BRANCHLESS: bool = true;
        #[inline(always)]
        fn len(&self) -> usize {
            self.0.values.len()
        }
        #[inline(always)]
        fn hash_row(&self, i: usize, _seed: i32) -> i32 {
            (self.0.f)(self.0.values[i])
        }
    }
    drive(&Copy(src), nulls, out);
}

/// `pmod(h, n)` for a fixed `n`, without a division per row (Lemire's fastmod).
#[derive(Debug, Clone, Copy)]
pub(super) struct Pmod {
    n: u64,
    /// `ceil(2^64 / n)` (wrapping to 0 for `n == 1`).
    m: u64,
    /// `2^31 mod n`.
    c: u64,
}

impl Pmod {
    pub(super) fn new(n: u32) -> Result<Self, Error> {
        if n == 0 {
            return Err(Error::InvalidArgument(
                "number of partitions must be at least 1".into(),
            ));
        }
        let n = u64::from(n);
        Ok(Self {
            n,
            m: (u64::MAX / n).wrapping_add(1),
            c: (1u64 << 31) % n,
        })
    }

    /// `((h % n) + n) % n`, Spark's `pmod` for a positive `n`.
    #[inline(always)]
    pub(super) fn apply(self, h: i32) -> u32 {
        // x = h + 2^31 lies in [0, 2^32); h mod n = (x mod n - 2^31 mod n) mod n.
        let x = (i64::from(h) + (1i64 << 31)) as u64;
        let r = ((u128::from(self.m.wrapping_mul(x)) * u128::from(self.n)) >> 64) as u64;
        (if r >= self.c {
            r - self.c
        } else {
            r + self.n - self.c
        }) as u32
    }
}

/// Spark's `hash(columns...)` for each row, into `out` (resized to `num_rows`), starting from
/// seed 42: Murmur3 x86_32 chained over the columns, a null value leaving the hash unchanged.
///
/// Every column must have `num_rows` rows and a supported type (see the module docs), else
/// [`Error::InvalidArgument`] is returned before anything is computed.
pub fn spark_hash(columns: &[&dyn Array], num_rows: usize, out: &mut Vec<i32>) -> Result<(), Error> {
    SparkHasher::new().hash_into(columns, num_rows, out)
}

/// Spark's `pmod(hash(columns...), n)` for each row, into `out` (resized to `num_rows`): the
/// partition `df.repartition(n, *columns)` sends the row to.
///
/// Fails with [`Error::InvalidArgument`] when `n` is 0 or as [`spark_hash`] does.
pub fn spark_partition_ids(
    columns: &[&dyn Array],
    num_rows: usize,
    n: u32,
    out: &mut Vec<u32>,
) -> Result<(), Error> {
    SparkHasher::new().partition_ids(columns, num_rows, n, out)
}
