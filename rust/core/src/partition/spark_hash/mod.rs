//! Spark SQL's `hash(cols...)` on Arrow arrays: the hash `df.repartition(n, *cols)` partitions by.
//!
//! Spark's `Murmur3Hash` expression (the one `HashPartitioning` uses, with seed 42) hashes the
//! key columns of a row one after another, each column's hash being the seed of the next, and a
//! null value leaves the running hash unchanged. The partition of a row is `pmod(hash, n)`.
//! This module reimplements that bit for bit (verified against Spark 4.0.1, see the tests),
//! column at a time: the data type is matched once per column, then a tight, monomorphised loop
//! runs over the rows, with a branch-free fast path for columns without nulls. On x86-64 CPUs
//! with AVX2 the fixed-width kernels run in a copy compiled for AVX2 (the one `unsafe` block).
//! [`SparkHasher`] keeps scratch space across batches; [`spark_hash`] and
//! [`spark_partition_ids`] are one-shot wrappers.
//!
//! # Type mapping (Arrow → what Spark hashes)
//!
//! | Arrow type | Spark type | hashed as |
//! | --- | --- | --- |
//! | `Null` | `NullType` | nothing (hash unchanged) |
//! | `Boolean` | `BooleanType` | `hashInt(1 or 0)` |
//! | `Int8`, `Int16`, `Int32` | `ByteType`, `ShortType`, `IntegerType` | `hashInt(value)` |
//! | `Int64` | `LongType` | `hashLong(value)` |
//! | `Float32` | `FloatType` | `hashInt(floatToIntBits(v))`, `-0.0` as `0.0`, one NaN |
//! | `Float64` | `DoubleType` | `hashLong(doubleToLongBits(v))`, `-0.0` as `0.0`, one NaN |
//! | `Date32` | `DateType` | `hashInt(days)` |
//! | `Date64` | `DateType` | `hashInt(floor(ms / 86_400_000))` (the day of the instant) |
//! | `Timestamp(unit, tz?)` | `TimestampType` / `TimestampNTZType` | `hashLong(micros)`; see below |
//! | `Duration(unit)` | `DayTimeIntervalType` | `hashLong(micros)`; see below |
//! | `Interval(YearMonth)` | `YearMonthIntervalType` | `hashInt(months)` |
//! | `Decimal32/64/128/256(p, s)`, `p <= 18` | `DecimalType(p, s)` | `hashLong(unscaled)` |
//! | `Decimal128/256(p, s)`, `p > 18` | `DecimalType(p, s)` | `hashUnsafeBytes(BigInteger.toByteArray)` |
//! | `Utf8`, `LargeUtf8`, `Utf8View` | `StringType` (UTF8_BINARY) | `hashUnsafeBytes(utf8 bytes)` |
//! | `Binary`, `LargeBinary`, `BinaryView`, `FixedSizeBinary` | `BinaryType` | `hashUnsafeBytes(bytes)` |
//! | `Struct` of supported types | `StructType` | fields chained in order, nulls skipped |
//! | `Dictionary(_, flat supported type)` | the value type | the decoded value |
//!
//! Semantic decisions where Arrow is richer than Spark:
//! - Spark's timestamps are microseconds. Seconds and milliseconds are multiplied up (wrapping
//!   on overflow, which Spark cannot represent anyway); nanoseconds are floor-divided to the
//!   microsecond that contains the instant (as Spark's own `Instant` to micros conversion
//!   does), so a pre-1970 nanosecond value rounds towards negative infinity. The same
//!   conversion applies to `Duration`.
//! - `Date64` is taken as the day (floor of milliseconds / 86,400,000), like Spark's `DateType`.
//! - Unsigned integers, `Float16`, `Time32/64`, `Interval(DayTime | MonthDayNano)` (Spark's
//!   `CalendarInterval` hashing differs between its interpreted and generated code), lists,
//!   maps, unions and run-end encoded arrays are rejected with [`Error::InvalidArgument`]:
//!   Spark has no single canonical hash for them. Cast unsigned keys to a signed type.
//! - Strings are hashed as bytes, i.e. Spark's default `UTF8_BINARY` collation.
//! - Spark reads 4-byte words in native (little-endian on every platform Spark ships for)
//!   order; this module always reads them little-endian.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    BinaryViewType, ByteArrayType, Date32Type, Date64Type, Decimal128Type, Decimal256Type, Decimal32Type,
    Decimal64Type, DurationMicrosecondType, DurationMillisecondType, DurationNanosecondType,
    DurationSecondType, Float32Type, Float64Type, GenericBinaryType, GenericStringType, Int16Type, Int32Type,
    Int64Type, Int8Type, IntervalYearMonthType, StringViewType, TimestampMicrosecondType,
    TimestampMillisecondType, TimestampNanosecondType, TimestampSecondType,
};
use arrow_array::{Array, ArrowPrimitiveType, GenericByteArray, GenericByteViewArray, OffsetSizeTrait};
use arrow_buffer::{i256, ArrowNativeType, BooleanBuffer, NullBuffer};
use arrow_schema::{DataType, IntervalUnit, TimeUnit};

use crate::base::error::Error;

/// The seed Spark's `hash()` and `HashPartitioning` start from.
pub const SPARK_HASH_SEED: i32 = 42;

const C1: u32 = 0xcc9e_2d51;
const C2: u32 = 0x1b87_3593;

/// The largest decimal precision Spark hashes as a long (`Decimal.MAX_LONG_DIGITS`).
const MAX_LONG_DIGITS: u8 = 18;

const SUPPORTED: &str = "supported key types: Null, Boolean, Int8, Int16, Int32, Int64, Float32, Float64, \
    Date32, Date64, Timestamp, Duration, Interval(YearMonth), Decimal32/64/128/256, Utf8, LargeUtf8, \
    Utf8View, Binary, LargeBinary, BinaryView, FixedSizeBinary, Struct of these, Dictionary of \
    these (not of Struct or Dictionary)";

// ---------------------------------------------------------------------------------------------
// Murmur3 x86_32 as Spark's `org.apache.spark.unsafe.hash.Murmur3_x86_32` computes it.
// ---------------------------------------------------------------------------------------------

#[inline(always)]
fn mix_k1(k1: i32) -> u32 {
    (k1 as u32).wrapping_mul(C1).rotate_left(15).wrapping_mul(C2)
}

#[inline(always)]
fn mix_h1(h1: u32, k1: u32) -> u32 {
    (h1 ^ k1)
        .rotate_left(13)
        .wrapping_mul(5)
        .wrapping_add(0xe654_6b64)
}

#[inline(always)]
fn fmix(h1: u32, len: u32) -> i32 {
    let mut h = h1 ^ len;
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^= h >> 16;
    h as i32
}

/// Spark's `Murmur3_x86_32.hashInt(value, seed)`.
#[inline(always)]
pub fn murmur3_hash_int(value: i32, seed: i32) -> i32 {
    fmix(mix_h1(seed as u32, mix_k1(value)), 4)
}

/// Spark's `Murmur3_x86_32.hashLong(value, seed)`: the low word, then the high word.
#[inline(always)]
pub fn murmur3_hash_long(value: i64, seed: i32) -> i32 {
    let h = mix_h1(seed as u32, mix_k1(value as i32));
    let h = mix_h1(h, mix_k1((value >> 32) as i32));
    fmix(h, 8)
}

/// Spark's `Murmur3_x86_32.hashUnsafeBytes(bytes, seed)`, the function Spark hashes strings,
/// binaries and large decimals with.
///
/// It is not standard Murmur3 for the tail: every byte after the last whole 4-byte word is
/// sign-extended to an int and mixed in as a block of its own.
#[inline]
pub fn murmur3_hash_bytes(bytes: &[u8], seed: i32) -> i32 {
    let mut h = seed as u32;
    let mut words = bytes.chunks_exact(4);
    for w in &mut words {
        h = mix_h1(h, mix_k1(i32::from_le_bytes([w[0], w[1], w[2], w[3]])));
    }
    for &b in words.remainder() {
        h = mix_h1(h, mix_k1(b as i8 as i32));
    }
    fmix(h, bytes.len() as u32)
}

/// Java's `Float.floatToIntBits` after Spark's `-0.0 → 0.0` normalisation.
#[inline(always)]
fn float_key(v: f32) -> i32 {
    if v == 0.0 {
        0 // +0.0 and -0.0
    } else if v.is_nan() {
        0x7fc0_0000 // floatToIntBits collapses every NaN to the canonical one
    } else {
        v.to_bits() as i32
    }
}

/// Java's `Double.doubleToLongBits` after Spark's `-0.0 → 0.0` normalisation.
#[inline(always)]
fn double_key(v: f64) -> i64 {
    if v == 0.0 {
        0
    } else if v.is_nan() {
        0x7ff8_0000_0000_0000
    } else {
        v.to_bits() as i64
    }
}

/// `hashUnsafeBytes` of Java's `BigInteger.toByteArray()`: the shortest big-endian two's
/// complement encoding that keeps the sign bit (at least one byte).
#[inline]
fn hash_big_endian_minimal(be: &[u8], seed: i32) -> i32 {
    let mut start = 0;
    while start + 1 < be.len() {
        let (b, next_negative) = (be[start], be[start + 1] & 0x80 != 0);
        if (b == 0x00 && !next_negative) || (b == 0xff && next_negative) {
            start += 1;
        } else {
            break;
        }
    }
    murmur3_hash_bytes(&be[start..], seed)
}

/// Microseconds from a value in `unit` (see the module docs for the rounding).
#[inline(always)]
fn to_micros<const UNIT: u8>(v: i64) -> i64 {
    match UNIT {
        0 => v.wrapping_mul(1_000_000),
        1 => v.wrapping_mul(1_000),
        2 => v,
        _ => v.div_euclid(1_000),
    }
}

// ---------------------------------------------------------------------------------------------
// Per-column kernels: one `RowHash` implementation per physical representation; the driver is
// generic over it, so the type is matched once per column and the row loop is monomorphised.
// ---------------------------------------------------------------------------------------------

/// Hashes row `i` of one column, chained on `seed`.
trait RowHash {
    /// Whether hashing a null row is cheap and harmless, so the driver may hash every row and
    /// select (branch-free) instead of skipping null rows.
    const BRANCHLESS: bool;
    /// Number of rows.
    fn len(&self) -> usize;
    /// The hash of (valid) row `i` with `seed` as the running hash.
    fn hash_row(&self, i: usize, seed: i32) -> i32;
    /// Hashes rows `base..base + out.len()`, all valid, in place.
    #[inline(always)]
    fn hash_range(&self, base: usize, out: &mut [i32]) {
        for (j, h) in out.iter_mut().enumerate() {
            *h = self.hash_row(base + j, *h);
        }
    }
}

/// Rows per block in the fixed-width kernels: the loads are split from the arithmetic so that
/// the compiler vectorises the latter (for 64-bit values this alone is about twice as fast).
const LANES: usize = 8;

/// A fixed-width column hashed with `hashInt(f(value))`.
struct IntCol<'a, T, F> {
    values: &'a [T],
    f: F,
}

impl<T: Copy, F: Fn(T) -> i32> RowHash for IntCol<'_, T, F> {
    const BRANCHLESS: bool = true;
    #[inline(always)]
    fn len(&self) -> usize {
        self.values.len()
    }
    #[inline(always)]
    fn hash_row(&self, i: usize, seed: i32) -> i32 {
        murmur3_hash_int((self.f)(self.values[i]), seed)
    }
    #[inline(always)]
    fn hash_range(&self, base: usize, out: &mut [i32]) {
        let values = &self.values[base..base + out.len()];
        let mut outs = out.chunks_exact_mut(LANES);
        let mut ins = values.chunks_exact(LANES);
        for (hs, vs) in (&mut outs).zip(&mut ins) {
            let keys: [i32; LANES] = std::array::from_fn(|j| (self.f)(vs[j]));
            for (h, k) in hs.iter_mut().zip(keys) {
                *h = murmur3_hash_int(k, *h);
            }
        }
        for (h, &v) in outs.into_remainder().iter_mut().zip(ins.remainder()) {
            *h = murmur3_hash_int((self.f)(v), *h);
        }
    }
}

/// A fixed-width column hashed with `hashLong(f(value))`.
struct LongCol<'a, T, F> {
    values: &'a [T],
    f: F,
}

impl<T: Copy, F: Fn(T) -> i64> RowHash for LongCol<'_, T, F> {
    const BRANCHLESS: bool = true;
    #[inline(always)]
    fn len(&self) -> usize {
        self.values.len()
    }
    #[inline(always)]
    fn hash_row(&self, i: usize, seed: i32) -> i32 {
        murmur3_hash_long((self.f)(self.values[i]), seed)
    }
    #[inline(always)]
    fn hash_range(&self, base: usize, out: &mut [i32]) {
        let values = &self.values[base..base + out.len()];
        let mut outs = out.chunks_exact_mut(LANES);
        let mut ins = values.chunks_exact(LANES);
        for (hs, vs) in (&mut outs).zip(&mut ins) {
            let longs: [i64; LANES] = std::array::from_fn(|j| (self.f)(vs[j]));
            let lo: [i32; LANES] = std::array::from_fn(|j| longs[j] as i32);
            let hi: [i32; LANES] = std::array::from_fn(|j| (longs[j] >> 32) as i32);
            for j in 0..LANES {
                hs[j] = fmix(mix_h1(mix_h1(hs[j] as u32, mix_k1(lo[j])), mix_k1(hi[j])), 8);
            }
        }
        for (h, &v) in outs.into_remainder().iter_mut().zip(ins.remainder()) {
            *h = murmur3_hash_long((self.f)(v), *h);
        }
    }
}

/// A boolean column: `hashInt(1 or 0)`.
struct BoolCol<'a>(&'a BooleanBuffer);

impl RowHash for BoolCol<'_> {
    const BRANCHLESS: bool = true;
    #[inline(always)]
    fn len(&self) -> usize {
        self.0.len()
    }
    #[inline(always)]
    fn hash_row(&self, i: usize, seed: i32) -> i32 {
        murmur3_hash_int(self.0.value(i) as i32, seed)
    }
}

/// A column of byte strings hashed with `hashUnsafeBytes`.
struct BytesCol<A>(A);

/// Random access to the bytes of a string or binary array.
trait ByteSource {
    fn len(&self) -> usize;
    fn bytes(&self, i: usize) -> &[u8];
}

impl<T: ByteArrayType> ByteSource for &GenericByteArray<T> {
    #[inline(always)]
    fn len(&self) -> usize {
        Array::len(*self)
    }
    #[inline(always)]
    fn bytes(&self, i: usize) -> &[u8] {
        let offsets = self.value_offsets();
        let (start, end) = (offsets[i].as_usize(), offsets[i + 1].as_usize());
        &self.value_data()[start..end]
    }
}

impl<T: arrow_array::types::ByteViewType + ?Sized> ByteSource for &GenericByteViewArray<T> {
    #[inline(always)]
    fn len(&self) -> usize {
        Array::len(*self)
    }
    #[inline(always)]
    fn bytes(&self, i: usize) -> &[u8] {
        self.value(i).as_ref()
    }
}

impl ByteSource for &arrow_array::FixedSizeBinaryArray {
    #[inline(always)]
    fn len(&self) -> usize {
        Array::len(*self)
    }
    #[inline(always)]
    fn bytes(&self, i: usize) -> &[u8] {
        self.value(i)
    }
}

impl<A: ByteSource> RowHash for BytesCol<A> {
    const BRANCHLESS: bool = false;
    #[inline(always)]
    fn len(&self) -> usize {
        self.0.len()
    }
    #[inline(always)]
    fn hash_row(&self, i: usize, seed: i32) -> i32 {
        murmur3_hash_bytes(self.0.bytes(i), seed)
    }
}

/// A decimal column of precision > 18: `hashUnsafeBytes(unscaledValue().toByteArray())`.
struct BigDecimalCol<'a, T>(&'a [T]);

impl RowHash for BigDecimalCol<'_, i128> {
    const BRANCHLESS: bool = false;
    #[inline(always)]
    fn len(&self) -> usize {
        self.0.len()
    }
    #[inline(always)]
    fn hash_row(&self, i: usize, seed: i32) -> i32 {
        hash_big_endian_minimal(&self.0[i].to_be_bytes(), seed)
    }
}

impl RowHash for BigDecimalCol<'_, i256> {
    const BRANCHLESS: bool = false;
    #[inline(always)]
    fn len(&self) -> usize {
        self.0.len()
    }
    #[inline(always)]
    fn hash_row(&self, i: usize, seed: i32) -> i32 {
        hash_big_endian_minimal(&self.0[i].to_be_bytes(), seed)
    }
}

/// Rows of a dictionary: row `i` is value `keys[i]` of the inner (values) column.
struct Gather<'a, R> {
    keys: &'a [usize],
    inner: R,
}

impl<R: RowHash> RowHash for Gather<'_, R> {
    const BRANCHLESS: bool = false;
    #[inline(always)]
    fn len(&self) -> usize {
        self.keys.len()
    }
    #[inline(always)]
    fn hash_row(&self, i: usize, seed: i32) -> i32 {
        self.inner.hash_row(self.keys[i], seed)
    }
}

/// Applies `r` to every valid row of `out` (`out[i]` is the running hash of row `i`).
///
/// Fixed-width kernels are pure 32-bit integer arithmetic over many independent rows; on x86-64
/// a copy compiled for AVX2 (8 lanes with a native 32-bit multiply, where the SSE2 baseline has
/// to emulate it) runs about twice as fast, so it is used when the CPU has AVX2.
#[inline]
fn drive<R: RowHash>(r: &R, nulls: Option<&NullBuffer>, out: &mut [i32]) {
    #[cfg(target_arch = "x86_64")]
    if R::BRANCHLESS && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: `drive_avx2` is safe code whose only requirement is that the CPU supports
        // AVX2, which was checked just above.
        unsafe { drive_avx2(r, nulls, out) };
        return;
    }
    drive_generic(r, nulls, out);
}

/// [`drive_generic`] compiled with AVX2 enabled (see [`drive`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn drive_avx2<R: RowHash>(r: &R, nulls: Option<&NullBuffer>, out: &mut [i32]) {
    drive_generic(r, nulls, out);
}

#[inline(always)]
fn drive_generic<R: RowHash>(r: &R, nulls: Option<&NullBuffer>, out: &mut [i32]) {
    assert_eq!(r.len(), out.len(), "column length checked by the caller");
    let Some(nulls) = nulls else {
        r.hash_range(0, out);
        return;
    };
    let chunks = nulls.inner().bit_chunks();
    let mut blocks = out.chunks_mut(64);
    let mut base = 0;
    for (word, block) in chunks.iter().zip(&mut blocks) {
        drive_word(r, word, base, block);
        base += 64;
    }
    if let Some(block) = blocks.next() {
        drive_word(r, chunks.remainder_bits(), base, block);
    }
}

/// Applies `r` to the rows `base..base + block.len()` whose bit in `valid` is set.
#[inline(always)]
fn drive_word<R: RowHash>(r: &R, valid: u64, base: usize, block: &mut [i32]) {
    if valid == 0 {
        return;
    }
    if valid == u64::MAX && block.len() == 64 {
        r.hash_range(base, block);
    } else if R::BRANCHLESS {
        let mut hashed = [0i32; 64];
        let hashed = &mut hashed[..block.len()];
        hashed.copy_from_slice(block);
        r.hash_range(base, hashed);
        for (j, (h, new)) in block.iter_mut().zip(hashed.iter()).enumerate() {
            *h = if (valid >> j) & 1 != 0 { *new } else { *h };
        }
    } else {
        let mut bits = valid;
        while bits != 0 {
            let j = bits.trailing_zeros() as usize;
            block[j] = r.hash_row(base + j, block[j]);
            bits &= bits - 1;
        }
    }
}

/// What to do with the kernel [`dispatch`] builds for a column.
trait Visit {
    fn visit<R: RowHash>(self, r: R);
}

/// Hash every valid row in place.
struct Apply<'a> {
    nulls: Option<&'a NullBuffer>,
    out: &'a mut [i32],
}

impl Visit for Apply<'_> {
    #[inline]
    fn visit<R: RowHash>(self, r: R) {
        drive(&r, self.nulls, self.out);
    }
}

/// Hash every valid row through dictionary keys.
struct ApplyGather<'a> {
    keys: &'a [usize],
    nulls: Option<&'a NullBuffer>,
    out: &'a mut [i32],
}

impl Visit for ApplyGather<'_> {
    #[inline]
    fn visit<R: RowHash>(self, inner: R) {
        drive(
            &Gather {
                keys: self.keys,
                inner,
            },
            self.nulls,
            self.out,
        );
    }
}

fn unsupported(dt: &DataType, why: &str) -> Error {
    Error::InvalidArgument(format!("cannot hash a key column of type {dt}{why}; {SUPPORTED}"))
}

/// Builds the kernel for a flat (non-struct, non-dictionary) column and hands it to `v`.
fn dispatch<V: Visit>(array: &dyn Array, v: V) -> Result<(), Error> {
    fn ints<T: ArrowPrimitiveType, V: Visit>(a: &dyn Array, v: V, f: impl Fn(T::Native) -> i32) {
        v.visit(IntCol {
            values: a.as_primitive::<T>().values(),
            f,
        });
    }
    fn longs<T: ArrowPrimitiveType, V: Visit>(a: &dyn Array, v: V, f: impl Fn(T::Native) -> i64) {
        v.visit(LongCol {
            values: a.as_primitive::<T>().values(),
            f,
        });
    }
    fn bytes<O: OffsetSizeTrait, V: Visit>(a: &dyn Array, v: V, utf8: bool) {
        if utf8 {
            v.visit(BytesCol(a.as_bytes::<GenericStringType<O>>()));
        } else {
            v.visit(BytesCol(a.as_bytes::<GenericBinaryType<O>>()));
        }
    }
    let a = array;
    match a.data_type() {
        DataType::Null => {}
        DataType::Boolean => v.visit(BoolCol(a.as_boolean().values())),
        DataType::Int8 => ints::<Int8Type, V>(a, v, |x| x as i32),
        DataType::Int16 => ints::<Int16Type, V>(a, v, |x| x as i32),
        DataType::Int32 => ints::<Int32Type, V>(a, v, |x| x),
        DataType::Int64 => longs::<Int64Type, V>(a, v, |x| x),
        DataType::Float32 => ints::<Float32Type, V>(a, v, float_key),
        DataType::Float64 => longs::<Float64Type, V>(a, v, double_key),
        DataType::Date32 => ints::<Date32Type, V>(a, v, |x| x),
        DataType::Date64 => ints::<Date64Type, V>(a, v, |ms| ms.div_euclid(86_400_000) as i32),
        DataType::Timestamp(unit, _) => match unit {
            TimeUnit::Second => longs::<TimestampSecondType, V>(a, v, to_micros::<0>),
            TimeUnit::Millisecond => longs::<TimestampMillisecondType, V>(a, v, to_micros::<1>),
            TimeUnit::Microsecond => longs::<TimestampMicrosecondType, V>(a, v, to_micros::<2>),
            TimeUnit::Nanosecond => longs::<TimestampNanosecondType, V>(a, v, to_micros::<3>),
        },
        DataType::Duration(unit) => match unit {
            TimeUnit::Second => longs::<DurationSecondType, V>(a, v, to_micros::<0>),
            TimeUnit::Millisecond => longs::<DurationMillisecondType, V>(a, v, to_micros::<1>),
            TimeUnit::Microsecond => longs::<DurationMicrosecondType, V>(a, v, to_micros::<2>),
            TimeUnit::Nanosecond => longs::<DurationNanosecondType, V>(a, v, to_micros::<3>),
        },
        DataType::Interval(IntervalUnit::YearMonth) => ints::<IntervalYearMonthType, V>(a, v, |x| x),
        DataType::Decimal32(..) => longs::<Decimal32Type, V>(a, v, |x| x as i64),
        DataType::Decimal64(..) => longs::<Decimal64Type, V>(a, v, |x| x),
        DataType::Decimal128(p, _) if *p <= MAX_LONG_DIGITS => longs::<Decimal128Type, V>(a, v, |x| x as i64),
        DataType::Decimal128(..) => v.visit(BigDecimalCol(a.as_primitive::<Decimal128Type>().values())),
        DataType::Decimal256(p, _) if *p <= MAX_LONG_DIGITS => {
            longs::<Decimal256Type, V>(a, v, |x| x.as_i128() as i64)
        }
        DataType::Decimal256(..) => v.visit(BigDecimalCol(a.as_primitive::<Decimal256Type>().values())),
        DataType::Utf8 => bytes::<i32, V>(a, v, true),
        DataType::LargeUtf8 => bytes::<i64, V>(a, v, true),
        DataType::Binary => bytes::<i32, V>(a, v, false),
        DataType::LargeBinary => bytes::<i64, V>(a, v, false),
        DataType::Utf8View => v.visit(BytesCol(a.as_byte_view::<StringViewType>())),
        DataType::BinaryView => v.visit(BytesCol(a.as_byte_view::<BinaryViewType>())),
        DataType::FixedSizeBinary(_) => v.visit(BytesCol(a.as_fixed_size_binary())),
        other => return Err(unsupported(other, "")),
    }
    Ok(())
}

/// Checks, before anything is hashed, that a key column of type `dt` can be hashed the way
/// Spark hashes it; the error names the type and lists the supported ones.
pub fn check_key_type(dt: &DataType) -> Result<(), Error> {
    match dt {
        DataType::Struct(fields) => fields.iter().try_for_each(|f| check_key_type(f.data_type())),
        DataType::Dictionary(_, values) => match values.as_ref() {
            DataType::Struct(_) | DataType::Dictionary(..) => {
                Err(unsupported(dt, " (dictionary values must be a flat type)"))
            }
            flat => check_flat(flat).map_err(|_| unsupported(dt, "")),
        },
        flat => check_flat(flat),
    }
}

fn check_flat(dt: &DataType) -> Result<(), Error> {
    match dt {
        DataType::Null
        | DataType::Boolean
        | DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::Float32
        | DataType::Float64
        | DataType::Date32
        | DataType::Date64
        | DataType::Timestamp(..)
        | DataType::Duration(_)
        | DataType::Interval(IntervalUnit::YearMonth)
        | DataType::Decimal32(..)
        | DataType::Decimal64(..)
        | DataType::Decimal128(..)
        | DataType::Decimal256(..)
        | DataType::Utf8
        | DataType::LargeUtf8
        | DataType::Utf8View
        | DataType::Binary
        | DataType::LargeBinary
        | DataType::BinaryView
        | DataType::FixedSizeBinary(_) => Ok(()),
        DataType::UInt8 | DataType::UInt16 | DataType::UInt32 | DataType::UInt64 => Err(unsupported(
            dt,
            " (Spark has no unsigned integers; cast the key to a signed type Spark would use)",
        )),
        DataType::Interval(_) => Err(unsupported(
            dt,
            " (Spark's CalendarInterval hash is not consistent across its code paths)",
        )),
        _ => Err(unsupported(dt, "")),
    }
}

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
struct Running<'a> {
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
fn hash_column(array: &dyn Array, parent: Option<&NullBuffer>, st: &mut Running<'_>) -> Result<(), Error> {
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
fn drive_copy<F: Fn(usize) -> i32>(src: &IntCol<'_, usize, F>, nulls: Option<&NullBuffer>, out: &mut [i32]) {
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
struct Pmod {
    n: u64,
    /// `ceil(2^64 / n)` (wrapping to 0 for `n == 1`).
    m: u64,
    /// `2^31 mod n`.
    c: u64,
}

impl Pmod {
    fn new(n: u32) -> Result<Self, Error> {
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
    fn apply(self, h: i32) -> u32 {
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

#[cfg(test)]
mod tests {
    //! Expected values marked "Spark 4.0.1" were computed by Spark itself: pyspark 4.0.1 on
    //! OpenJDK 17, `local[1]`, `spark.sql.session.timeZone=UTC`, e.g.
    //! `spark.sql("select hash(cast(1 as int)), hash('abc'), ...").collect()`, and for the
    //! data-driven checks non-foldable columns over `range(10000)` (so Spark's generated code
    //! ran, not only constant folding). The script is quoted in `spark_data_driven_checksums`.

    use super::*;
    use arrow_array::builder::StringDictionaryBuilder;
    use arrow_array::types::{Int32Type as K32, Int8Type as K8};
    use arrow_array::{
        ArrayRef, BinaryArray, BinaryViewArray, BooleanArray, Date32Array, Date64Array, Decimal128Array,
        Decimal256Array, Decimal32Array, Decimal64Array, DictionaryArray, DurationMicrosecondArray,
        DurationNanosecondArray, FixedSizeBinaryArray, Float32Array, Float64Array, Int16Array, Int32Array,
        Int64Array, Int8Array, IntervalYearMonthArray, LargeBinaryArray, LargeStringArray, NullArray,
        StringArray, StringViewArray, StructArray, TimestampMicrosecondArray, TimestampMillisecondArray,
        TimestampNanosecondArray, TimestampSecondArray, UInt32Array,
    };
    use arrow_schema::{Field, Fields};
    use proptest::prelude::*;

    fn hash_cols(cols: &[&dyn Array]) -> Vec<i32> {
        let n = cols.first().map_or(0, |c| c.len());
        let mut out = vec![7; 3]; // garbage that must be overwritten
        spark_hash(cols, n, &mut out).unwrap();
        out
    }

    fn hash1(col: &dyn Array) -> Vec<i32> {
        hash_cols(&[col])
    }

    #[test]
    fn murmur_primitives_match_spark() {
        // Spark 4.0.1: hash(cast(x as int)), hash(xL).
        for (v, h) in [
            (1, -559580957),
            (0, 933211791),
            (-1, -1604776387),
            (i32::MAX, 133916647),
            (i32::MIN, 723455942),
        ] {
            assert_eq!(murmur3_hash_int(v, 42), h, "int {v}");
        }
        for (v, h) in [
            (1i64, -1712319331),
            (0, -1670924195),
            (-1, -939490007),
            (i64::MIN, -853646085),
            (i64::MAX, -1604625029),
            (1234567890123, 1304145252),
        ] {
            assert_eq!(murmur3_hash_long(v, 42), h, "long {v}");
        }
    }

    #[test]
    fn integers_and_booleans() {
        // Spark 4.0.1.
        assert_eq!(
            hash1(&Int32Array::from(vec![1, 0, -1, i32::MAX, i32::MIN])),
            [-559580957, 933211791, -1604776387, 133916647, 723455942]
        );
        assert_eq!(hash1(&Int8Array::from(vec![-42])), [1758484645]);
        assert_eq!(hash1(&Int16Array::from(vec![-300])), [-1692660704]);
        assert_eq!(
            hash1(&Int64Array::from(vec![
                1,
                0,
                -1,
                i64::MIN,
                i64::MAX,
                1234567890123
            ])),
            [
                -1712319331,
                -1670924195,
                -939490007,
                -853646085,
                -1604625029,
                1304145252
            ]
        );
        assert_eq!(
            hash1(&BooleanArray::from(vec![true, false])),
            [-559580957, 933211791]
        );
    }

    const STRINGS: [(&str, i32); 13] = [
        // Spark 4.0.1: hash('...'). Lengths 0..9 exercise every tail length.
        ("", 142593372),
        ("a", 1485273170),
        ("ab", -97053317),
        ("abc", 1322437556),
        ("abcd", -396302900),
        ("abcde", 814637928),
        ("abcdef", 724255765),
        ("abcdefg", 2132013596),
        ("abcdefgh", -804741815),
        ("abcdefghi", -1830117711),
        ("héllo wörld", -281075962),
        ("日本語", -1143049834),
        ("😀x", -1814635023),
    ];

    #[test]
    fn strings_every_representation() {
        let strs: Vec<&str> = STRINGS.iter().map(|s| s.0).collect();
        let want: Vec<i32> = STRINGS.iter().map(|s| s.1).collect();
        assert_eq!(hash1(&StringArray::from(strs.clone())), want);
        assert_eq!(hash1(&LargeStringArray::from(strs.clone())), want);
        assert_eq!(hash1(&StringViewArray::from(strs.clone())), want);
        let bytes: Vec<&[u8]> = strs.iter().map(|s| s.as_bytes()).collect();
        assert_eq!(hash1(&BinaryArray::from(bytes.clone())), want);
        assert_eq!(hash1(&LargeBinaryArray::from(bytes.clone())), want);
        assert_eq!(hash1(&BinaryViewArray::from(bytes)), want);
    }

    #[test]
    fn binary_with_high_bytes() {
        // Spark 4.0.1: hash(X''), hash(X'FF'), hash(X'80FF7F'), hash(X'0102030405'). Tail bytes
        // are sign-extended, so 0xFF and 0x80 catch an unsigned tail.
        let v: Vec<&[u8]> = vec![b"", b"\xff", b"\x80\xff\x7f", b"\x01\x02\x03\x04\x05"];
        assert_eq!(
            hash1(&BinaryArray::from(v)),
            [142593372, 1398487324, 1911184379, -2064006189]
        );
        let fixed = FixedSizeBinaryArray::try_from_iter([[0x80u8, 0xff, 0x7f]].into_iter()).unwrap();
        assert_eq!(hash1(&fixed), [1911184379]);
    }

    #[test]
    fn floats_normalise_zero_and_nan() {
        // Spark 4.0.1: hash(cast(x as double)), hash(cast(x as float)).
        let d = Float64Array::from(vec![0.0, -0.0, 1.5, f64::NAN, -2.25, f64::INFINITY]);
        assert_eq!(
            hash1(&d),
            [
                -1670924195,
                -1670924195,
                1290763749,
                -1281358385,
                170083257,
                833680482
            ]
        );
        let other_nan = f64::from_bits(0xfff8_0000_dead_beef);
        assert!(other_nan.is_nan());
        assert_eq!(hash1(&Float64Array::from(vec![other_nan])), [-1281358385]);
        let f = Float32Array::from(vec![0.0, -0.0, 1.5, f32::NAN, -2.25, f32::from_bits(0xffc0_0001)]);
        assert_eq!(
            hash1(&f),
            [
                933211791,
                933211791,
                -221251528,
                -349261430,
                -1792172483,
                -349261430
            ]
        );
    }

    #[test]
    fn dates() {
        // Spark 4.0.1: hash(cast('2024-01-02' as date)), '1969-12-31', '1970-01-01'.
        let want = [-21057580, -1604776387, 933211791];
        assert_eq!(hash1(&Date32Array::from(vec![19724, -1, 0])), want);
        // Date64: the day containing the instant (floor), so -1 ms is 1969-12-31.
        let ms = vec![19724 * 86_400_000 + 5, -1, 86_399_999];
        assert_eq!(hash1(&Date64Array::from(ms)), want);
    }

    #[test]
    fn timestamps_all_units() {
        // Spark 4.0.1 (UTC): hash(timestamp'2024-01-01 00:00:00') = 1545358984,
        // hash(timestamp'1969-12-31 23:59:59.999999') = -939490007 (-1 µs),
        // hash(timestamp_ntz'2024-01-01 00:00:00.123456') = -1894121283.
        let secs = 1_704_067_200i64;
        let us = TimestampMicrosecondArray::from(vec![secs * 1_000_000, -1, secs * 1_000_000 + 123_456]);
        assert_eq!(hash1(&us), [1545358984, -939490007, -1894121283]);
        assert_eq!(
            hash1(&us.clone().with_timezone("UTC")),
            [1545358984, -939490007, -1894121283]
        );
        assert_eq!(hash1(&TimestampSecondArray::from(vec![secs])), [1545358984]);
        assert_eq!(
            hash1(&TimestampMillisecondArray::from(vec![secs * 1000])),
            [1545358984]
        );
        // Nanoseconds floor to the containing microsecond: -1 ns is in the µs -1.
        let ns = TimestampNanosecondArray::from(vec![secs * 1_000_000_000 + 999, -1, -1000]);
        assert_eq!(hash1(&ns), [1545358984, -939490007, -939490007]);
    }

    #[test]
    fn intervals() {
        // Spark 4.0.1: hash(interval '1' day), hash(interval '1 02:03:04.5' day to second),
        // hash(interval '2' year), hash(interval '-3' month).
        let us = DurationMicrosecondArray::from(vec![86_400_000_000, 93_784_500_000]);
        assert_eq!(hash1(&us), [892267096, 1326975016]);
        let ns = DurationNanosecondArray::from(vec![86_400_000_000_000]);
        assert_eq!(hash1(&ns), [892267096]);
        assert_eq!(
            hash1(&IntervalYearMonthArray::from(vec![24, -3])),
            [69695535, -1573329414]
        );
    }

    #[test]
    fn decimals_small_and_large() {
        // Spark 4.0.1: hash(cast(1.23 as decimal(10,2))) = -46242105, -1.23 → 1993430267, same
        // for decimal(18,2); decimal(19,2) and (38,2) hash the unscaled bytes: 1.23 → -1536290115.
        let small = |p| {
            Decimal128Array::from(vec![123, -123])
                .with_precision_and_scale(p, 2)
                .unwrap()
        };
        assert_eq!(hash1(&small(10)), [-46242105, 1993430267]);
        assert_eq!(hash1(&small(18)), [-46242105, 1993430267]);
        let d32 = Decimal32Array::from(vec![123, -123])
            .with_precision_and_scale(9, 2)
            .unwrap();
        assert_eq!(hash1(&d32), [-46242105, 1993430267]);
        let d64 = Decimal64Array::from(vec![123, -123])
            .with_precision_and_scale(18, 2)
            .unwrap();
        assert_eq!(hash1(&d64), [-46242105, 1993430267]);

        // Spark 4.0.1, decimal(38, s) values: (unscaled, hash).
        let big: [(i128, i32); 13] = [
            (123, -1536290115),
            (-123, 1285747285),
            (0, -783713497),
            (-1, 1398487324),
            (128, -544401882),
            (-128, 775851899),
            (-129, -771458971),
            (255, 1246198977),
            (12345678901234567890123456789123456789, -225838922),
            (-12345678901234567890123456789123456789, -484092182),
            (10i128.pow(38) - 1, -817514053),
            (-(10i128.pow(38) - 1), 1400911110),
            (123, -1536290115),
        ];
        let values: Vec<i128> = big.iter().map(|b| b.0).collect();
        let want: Vec<i32> = big.iter().map(|b| b.1).collect();
        let d = Decimal128Array::from(values.clone())
            .with_precision_and_scale(38, 2)
            .unwrap();
        assert_eq!(hash1(&d), want);
        let d = Decimal128Array::from(values.clone())
            .with_precision_and_scale(19, 2)
            .unwrap();
        assert_eq!(hash1(&d), want); // precision only selects the rule; values are as stored
        let wide: Vec<i256> = values.iter().map(|v| i256::from_i128(*v)).collect();
        let d = Decimal256Array::from(wide.clone())
            .with_precision_and_scale(38, 2)
            .unwrap();
        assert_eq!(hash1(&d), want);
        let d = Decimal256Array::from(vec![i256::from_i128(123)])
            .with_precision_and_scale(10, 2)
            .unwrap();
        assert_eq!(hash1(&d), [-46242105]);
    }

    #[test]
    fn multi_column_with_nulls() {
        // Spark 4.0.1: hash(1, 'a', null, 2L) = -947240264; hash(null) = 42;
        // hash(cast(null as bigint), 5L) = hash(5L, cast(null as bigint)) = 1607884268;
        // hash('x', cast(null as double), cast(3 as int)) = -860169833.
        let a = Int32Array::from(vec![Some(1), None, None, None]);
        let s = StringArray::from(vec![Some("a"), None, None, Some("x")]);
        let n = NullArray::new(4);
        let d = Float64Array::from(vec![None, None, None, None::<f64>]);
        let l = Int64Array::from(vec![Some(2), None, Some(5), None]);
        let i = Int32Array::from(vec![None, None, None, Some(3)]);
        assert_eq!(
            hash_cols(&[&a, &s, &n, &d, &l, &i]),
            [-947240264, 42, 1607884268, -860169833]
        );
        let l2 = Int64Array::from(vec![None, None, Some(5), None]);
        let z = Int64Array::from(vec![None::<i64>; 4]);
        assert_eq!(hash_cols(&[&l2, &z]), [42, 42, 1607884268, 42]);
        let mut out = vec![1, 2, 3];
        spark_hash(&[], 2, &mut out).unwrap();
        assert_eq!(out, [42, 42]);
    }

    #[test]
    fn structs() {
        // Spark 4.0.1: hash(named_struct('a', 1, 'b', 'x')) = -1305545736,
        // hash(named_struct('a', cast(null as int), 'b', 'x')) = -80340190,
        // hash(cast(null as struct<a:int,b:string>)) = 42,
        // hash(named_struct('a', 1, 'b', 'x'), 7L) = -1198669708.
        let fields = Fields::from(vec![
            Field::new("a", DataType::Int32, true),
            Field::new("b", DataType::Utf8, true),
        ]);
        let a: ArrayRef = Arc::new(Int32Array::from(vec![Some(1), None, Some(1), Some(1)]));
        let b: ArrayRef = Arc::new(StringArray::from(vec!["x", "x", "x", "x"]));
        let nulls = NullBuffer::from(vec![true, true, false, true]);
        let st = StructArray::new(fields, vec![a, b], Some(nulls));
        assert_eq!(hash1(&st), [-1305545736, -80340190, 42, -1305545736]);
        let seven = Int64Array::from(vec![None, None, None, Some(7)]);
        assert_eq!(hash_cols(&[&st, &seven])[3], -1198669708);
        let empty = StructArray::new_empty_fields(2, None);
        assert_eq!(hash1(&empty), [42, 42]);
    }

    #[test]
    fn dictionaries_hash_decoded_values() {
        let mut b = StringDictionaryBuilder::<K8>::new();
        for s in ["abc", "", "abc", "日本語", "abc"] {
            b.append_value(s);
        }
        b.append_null();
        let dict = b.finish();
        let want = [1322437556, 142593372, 1322437556, -1143049834, 1322437556, 42];
        // First column: values hashed once and gathered.
        assert_eq!(hash1(&dict), want);
        // Later column: gathered per row with each row's seed.
        let first = Int64Array::from(vec![None::<i64>; 6]);
        assert_eq!(hash_cols(&[&first, &dict]), want);
        let first = Int64Array::from(vec![1, 1, 1, 1, 1, 1]);
        let plain = StringArray::from(vec![
            Some("abc"),
            Some(""),
            Some("abc"),
            Some("日本語"),
            Some("abc"),
            None,
        ]);
        assert_eq!(hash_cols(&[&first, &dict]), hash_cols(&[&first, &plain]));
        // A null in the dictionary values, and an unused value.
        let values = Int32Array::from(vec![Some(1), None, Some(99)]);
        let keys = Int32Array::from(vec![Some(0), Some(1), None, Some(0)]);
        let d = DictionaryArray::<K32>::try_new(keys, Arc::new(values)).unwrap();
        assert_eq!(hash1(&d), [-559580957, 42, 42, -559580957]);
        assert_eq!(hash_cols(&[&first.slice(0, 4), &d])[1], murmur3_hash_long(1, 42));
    }

    #[test]
    fn sliced_arrays() {
        let full = StringArray::from(vec![Some("zz"), None, Some("abcde"), Some("a"), None]);
        let ints = Int32Array::from(vec![Some(5), Some(1), None, Some(0), Some(9)]);
        let s = full.slice(2, 3);
        let i = ints.slice(2, 3);
        assert_eq!(
            hash_cols(&[&i, &s]),
            [
                814637928,
                murmur3_hash_bytes(b"a", 933211791),
                murmur3_hash_int(9, 42)
            ]
        );
        // Offsets across a 64-row boundary with nulls.
        let v: Vec<Option<i64>> = (0..300).map(|x| (x % 3 != 0).then_some(x)).collect();
        let arr = Int64Array::from(v.clone());
        for off in [0, 1, 63, 64, 65, 130] {
            let got = hash1(&arr.slice(off, 300 - off));
            let want: Vec<i32> = v[off..]
                .iter()
                .map(|x| x.map_or(42, |x| murmur3_hash_long(x, 42)))
                .collect();
            assert_eq!(got, want, "offset {off}");
        }
    }

    #[test]
    fn partition_ids_match_spark_repartition() {
        // Spark 4.0.1: `range(-50, 50)` with k = cast(id as int), s = concat('s', id);
        // `repartition(7, "k", "s")` put every row in pmod(hash(k, s), 7) (0 mismatches), e.g.
        let rows = [
            (-50, "s-50", -333211784, 4),
            (-49, "s-49", -836151451, 5),
            (-48, "s-48", 950706533, 0),
            (-47, "s-47", 621089579, 5),
            (-46, "s-46", 1094726755, 3),
            (-45, "s-45", 142434656, 0),
        ];
        let k = Int32Array::from(rows.iter().map(|r| r.0).collect::<Vec<_>>());
        let s = StringArray::from(rows.iter().map(|r| r.1).collect::<Vec<_>>());
        assert_eq!(hash_cols(&[&k, &s]), rows.iter().map(|r| r.2).collect::<Vec<_>>());
        let mut out = vec![];
        spark_partition_ids(&[&k, &s], rows.len(), 7, &mut out).unwrap();
        assert_eq!(out, rows.iter().map(|r| r.3).collect::<Vec<_>>());
        let mut hasher = SparkHasher::new();
        hasher.partition_ids(&[&k, &s], rows.len(), 1, &mut out).unwrap();
        assert_eq!(out, [0; 6]);
    }

    #[test]
    fn spark_data_driven_checksums() {
        // Spark 4.0.1, generated code over non-constant rows:
        //   select id,
        //     case when id % 7 = 3 then null else cast(id * 7919 - 40000000 as int) end as a,
        //     case when id % 5 = 1 then null else id * id * 12345678901 - 600000000000000000 end as b,
        //     case when id % 11 = 4 then null else concat(repeat('é', cast(id % 3 as int)),
        //       repeat('x', cast(id % 11 as int)), cast(id as string)) end as s,
        //     case when id % 13 = 0 then null else cast(id as double) / 8 - 300 end as d,
        //     case when id % 9 = 2 then null else (cast(id as decimal(38,0)) - 5000)
        //       * cast('1234567890123456789012345' as decimal(38,0)) end as dec,   -- decimal(38,0)
        //     case when id % 6 = 5 then null
        //       else cast((id - 5000) * 1125 as decimal(12,0)) / 1000 end as sdec, -- decimal(18,6)
        //     case when id % 8 = 1 then null else timestamp_micros(id * 123456789 - 600000000000) end as ts,
        //     case when id % 10 = 7 then null else date_from_unix_date(cast(id - 5000 as int)) end as dt,
        //     case when id % 4 = 2 then null else cast(cast(id as double) / 4 - 100 as float) end as f,
        //     case when id % 17 = 0 then null else id % 3 = 0 end as bo
        //   from range(10000)
        // then sum(hash(c)) per column, sum(hash(all columns)), sum(pmod(hash(all), 7)), sum(hash(s, a)).
        let ids = 0..10_000i64;
        let opt = |m: i64, r: i64| move |id: i64| id % m != r;
        let a: Int32Array = ids
            .clone()
            .map(|i| opt(7, 3)(i).then(|| (i * 7919 - 40_000_000) as i32))
            .collect();
        let b: Int64Array = ids
            .clone()
            .map(|i| opt(5, 1)(i).then(|| i * i * 12_345_678_901 - 600_000_000_000_000_000))
            .collect();
        let s: StringArray = ids
            .clone()
            .map(|i| {
                opt(11, 4)(i).then(|| {
                    format!(
                        "{}{}{i}",
                        "é".repeat((i % 3) as usize),
                        "x".repeat((i % 11) as usize)
                    )
                })
            })
            .collect();
        let d: Float64Array = ids
            .clone()
            .map(|i| opt(13, 0)(i).then(|| i as f64 / 8.0 - 300.0))
            .collect();
        let dec = ids
            .clone()
            .map(|i| opt(9, 2)(i).then(|| (i as i128 - 5000) * 1_234_567_890_123_456_789_012_345))
            .collect::<Decimal128Array>()
            .with_precision_and_scale(38, 0)
            .unwrap();
        let sdec = ids
            .clone()
            .map(|i| opt(6, 5)(i).then(|| (i as i128 - 5000) * 1_125_000))
            .collect::<Decimal128Array>()
            .with_precision_and_scale(18, 6)
            .unwrap();
        let ts: TimestampMicrosecondArray = ids
            .clone()
            .map(|i| opt(8, 1)(i).then(|| i * 123_456_789 - 600_000_000_000))
            .collect();
        let ts = ts.with_timezone("UTC");
        let dt: Date32Array = ids
            .clone()
            .map(|i| opt(10, 7)(i).then(|| (i - 5000) as i32))
            .collect();
        let f: Float32Array = ids
            .clone()
            .map(|i| opt(4, 2)(i).then(|| (i as f64 / 4.0 - 100.0) as f32))
            .collect();
        let bo: BooleanArray = ids.clone().map(|i| opt(17, 0)(i).then_some(i % 3 == 0)).collect();

        let sum = |cols: &[&dyn Array]| hash_cols(cols).iter().map(|&h| h as i64).sum::<i64>();
        assert_eq!(sum(&[&a]), 130579573319);
        assert_eq!(sum(&[&b]), -263914924640);
        assert_eq!(sum(&[&s]), 20706841621);
        assert_eq!(sum(&[&d]), 112777939086);
        assert_eq!(sum(&[&dec]), 65791680454);
        assert_eq!(sum(&[&sdec]), 5564488425);
        assert_eq!(sum(&[&ts]), -203866589773);
        assert_eq!(sum(&[&dt]), -208934742390);
        assert_eq!(sum(&[&f]), -41172924298);
        assert_eq!(sum(&[&bo]), 4099565339363);
        let all: [&dyn Array; 10] = [&a, &b, &s, &d, &dec, &sdec, &ts, &dt, &f, &bo];
        assert_eq!(sum(&all), 129952073704);
        assert_eq!(
            &hash_cols(&all)[..5],
            [2137053658, -1856568455, 740052650, 1632737226, 1692632850]
        );
        let mut parts = vec![];
        spark_partition_ids(&all, 10_000, 7, &mut parts).unwrap();
        assert_eq!(parts.iter().map(|&p| p as i64).sum::<i64>(), 30266);
        assert_eq!(sum(&[&s, &a]), 108686431347);
    }

    #[test]
    fn rejects_bad_input() {
        let u = UInt32Array::from(vec![1]);
        let err = spark_hash(&[&u], 1, &mut vec![]).unwrap_err().to_string();
        assert!(
            err.contains("UInt32") && err.contains("supported key types"),
            "{err}"
        );
        let list = arrow_array::ListArray::from_iter_primitive::<Int32Type, _, _>(vec![Some(vec![Some(1)])]);
        let err = spark_hash(&[&list], 1, &mut vec![]).unwrap_err().to_string();
        assert!(err.contains("List"), "{err}");
        let i = Int32Array::from(vec![1, 2]);
        let mut out = vec![5];
        let err = spark_hash(&[&i], 3, &mut out).unwrap_err().to_string();
        assert!(err.contains("2 rows") && err.contains('3'), "{err}");
        assert_eq!(out, [5], "untouched on error");
        assert!(spark_partition_ids(&[&i], 2, 0, &mut vec![]).is_err());
        let mut b = StringDictionaryBuilder::<K8>::new();
        b.append_value("x");
        let inner = b.finish();
        let keys = Int8Array::from(vec![0]);
        let nested = DictionaryArray::<K8>::try_new(keys, Arc::new(inner)).unwrap();
        assert!(spark_hash(&[&nested], 1, &mut vec![]).is_err());
    }

    // ---------------------------------------------------------------------------------------
    // Property tests against a row-at-a-time scalar reference.
    // ---------------------------------------------------------------------------------------

    #[derive(Debug, Clone)]
    enum Scalar {
        I32(Option<i32>),
        I64(Option<i64>),
        F64(Option<f64>),
        Str(Option<String>),
    }

    fn reference(row: &[Scalar]) -> i32 {
        row.iter().fold(SPARK_HASH_SEED, |h, v| match v {
            Scalar::I32(Some(x)) => murmur3_hash_int(*x, h),
            Scalar::I64(Some(x)) => murmur3_hash_long(*x, h),
            Scalar::F64(Some(x)) => {
                let bits = if *x == 0.0 {
                    0
                } else if x.is_nan() {
                    0x7ff8_0000_0000_0000
                } else {
                    x.to_bits() as i64
                };
                murmur3_hash_long(bits, h)
            }
            Scalar::Str(Some(s)) => murmur3_hash_bytes(s.as_bytes(), h),
            _ => h,
        })
    }

    /// One column: its kind (0..4), whether it has nulls, and how to encode it.
    #[derive(Debug, Clone)]
    struct Col {
        kind: u8,
        nullable: bool,
        encoding: u8, // 0 plain, 1 sliced, 2 dictionary (strings) / view
        seed: u64,
    }

    fn cell(col: &Col, row: usize) -> Scalar {
        let x = (col.seed ^ (row as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)).rotate_left(17);
        let null = col.nullable && x & 3 == 0;
        let pick = x >> 8;
        match col.kind {
            0 => Scalar::I32((!null).then_some(pick as i32)),
            1 => Scalar::I64((!null).then_some([pick as i64, i64::MIN, -1, 0][(x >> 3) as usize % 4])),
            2 => Scalar::F64(
                (!null).then_some([pick as f64 - 1e9, -0.0, f64::NAN, 0.5][(x >> 3) as usize % 4]),
            ),
            _ => Scalar::Str((!null).then(|| {
                let n = (x >> 3) as usize % 14;
                ["a", "é", "日", "xy"]
                    .iter()
                    .cycle()
                    .skip((x >> 2) as usize % 4)
                    .take(n)
                    .copied()
                    .collect()
            })),
        }
    }

    fn build(col: &Col, rows: usize) -> ArrayRef {
        let pad = if col.encoding == 1 { 3 } else { 0 };
        let cells: Vec<Scalar> = (0..rows + pad).map(|r| cell(col, r.wrapping_sub(pad))).collect();
        macro_rules! prim {
            ($variant:ident, $arr:ty) => {{
                let v = cells.iter().map(|c| match c {
                    Scalar::$variant(v) => *v,
                    _ => unreachable!(),
                });
                let a: $arr = if col.nullable {
                    v.collect()
                } else {
                    v.map(Option::unwrap).collect::<Vec<_>>().into()
                };
                Arc::new(a) as ArrayRef
            }};
        }
        let arr = match col.kind {
            0 => prim!(I32, Int32Array),
            1 => prim!(I64, Int64Array),
            2 => prim!(F64, Float64Array),
            _ => {
                let v: Vec<Option<String>> = cells
                    .iter()
                    .map(|c| match c {
                        Scalar::Str(s) => s.clone(),
                        _ => unreachable!(),
                    })
                    .collect();
                match col.encoding {
                    2 => {
                        let mut b = StringDictionaryBuilder::<K32>::new();
                        for s in &v {
                            b.append_option(s.as_deref());
                        }
                        Arc::new(b.finish()) as ArrayRef
                    }
                    3 => Arc::new(StringViewArray::from_iter(v.iter().map(|s| s.as_deref()))),
                    _ => Arc::new(StringArray::from_iter(v.iter().map(|s| s.as_deref()))),
                }
            }
        };
        arr.slice(pad, rows)
    }

    fn col_strategy() -> impl Strategy<Value = Col> {
        (0u8..4, any::<bool>(), 0u8..4, any::<u64>()).prop_map(|(kind, nullable, encoding, seed)| Col {
            kind,
            nullable,
            encoding,
            seed,
        })
    }

    proptest! {
        #[test]
        fn matches_scalar_reference(cols in prop::collection::vec(col_strategy(), 1..5), rows in 0usize..300) {
            let arrays: Vec<ArrayRef> = cols.iter().map(|c| build(c, rows)).collect();
            let refs: Vec<&dyn Array> = arrays.iter().map(|a| a.as_ref()).collect();
            let mut got = vec![];
            spark_hash(&refs, rows, &mut got).unwrap();
            let want: Vec<i32> = (0..rows)
                .map(|r| reference(&cols.iter().map(|c| cell(c, r)).collect::<Vec<_>>()))
                .collect();
            prop_assert_eq!(&got, &want);
        }

        #[test]
        fn pmod_matches_rem_euclid(h in any::<i32>(), n in 1u32..=u32::MAX) {
            let want = i64::from(h).rem_euclid(i64::from(n)) as u32;
            prop_assert_eq!(Pmod::new(n).unwrap().apply(h), want);
            let small = n % 1000 + 1;
            prop_assert_eq!(Pmod::new(small).unwrap().apply(h), h.rem_euclid(small as i32) as u32);
        }
    }

    #[test]
    fn portable_and_dispatched_drivers_agree() {
        // `drive` may take the AVX2 copy; the portable one must compute the same.
        let v: Vec<Option<i64>> = (0..1000i64)
            .map(|x| (x % 7 != 3).then_some(x * -0x1234_5678_9abc))
            .collect();
        let a = Int64Array::from(v);
        let f = Float32Array::from_iter_values((0..1000).map(|x| x as f32 * -0.75));
        for nulls in [a.nulls(), None] {
            let kernel = LongCol {
                values: a.values().as_ref(),
                f: |x: i64| x,
            };
            let (mut x, mut y) = (vec![5; 1000], vec![5; 1000]);
            drive(&kernel, nulls, &mut x);
            drive_generic(&kernel, nulls, &mut y);
            assert_eq!(x, y);
            let kernel = IntCol {
                values: f.values().as_ref(),
                f: float_key,
            };
            drive(&kernel, nulls, &mut x);
            drive_generic(&kernel, nulls, &mut y);
            assert_eq!(x, y);
        }
    }

    #[test]
    fn pmod_edges() {
        for n in [1u32, 2, 3, 7, 200, 1 << 31, u32::MAX, i32::MAX as u32] {
            for h in [i32::MIN, i32::MIN + 1, -7, -1, 0, 1, 6, i32::MAX] {
                let want = i64::from(h).rem_euclid(i64::from(n)) as u32;
                assert_eq!(Pmod::new(n).unwrap().apply(h), want, "h={h} n={n}");
            }
        }
    }
}
