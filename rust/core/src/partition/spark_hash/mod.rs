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
//!
//! Rooms: `murmur3` (the scalar hash and conversions), `columns` (the per-column kernels and
//! their drivers), `dispatch` (type → kernel, key type checks), `hasher` ([`SparkHasher`] and
//! the one-shot functions).

mod columns;
mod dispatch;
mod hasher;
mod murmur3;
#[cfg(test)]
mod tests;

pub use dispatch::check_key_type;
pub use hasher::{spark_hash, spark_partition_ids, SparkHasher};
pub use murmur3::{murmur3_hash_bytes, murmur3_hash_int, murmur3_hash_long, SPARK_HASH_SEED};

#[cfg(doc)]
use crate::base::error::Error;
