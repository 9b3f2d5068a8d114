//! From an Arrow column to its kernel: the data type is matched once per column
//! ([`dispatch`]), and [`check_key_type`] refuses, before anything is hashed, a type Spark has no
//! single hash for.

use arrow_array::cast::AsArray;
use arrow_array::types::{
    BinaryViewType, Date32Type, Date64Type, Decimal128Type, Decimal256Type, Decimal32Type, Decimal64Type,
    DurationMicrosecondType, DurationMillisecondType, DurationNanosecondType, DurationSecondType,
    Float32Type, Float64Type, GenericBinaryType, GenericStringType, Int16Type, Int32Type, Int64Type,
    Int8Type, IntervalYearMonthType, StringViewType, TimestampMicrosecondType, TimestampMillisecondType,
    TimestampNanosecondType, TimestampSecondType,
};
use arrow_array::{Array, ArrowPrimitiveType, OffsetSizeTrait};
use arrow_buffer::NullBuffer;
use arrow_schema::{DataType, IntervalUnit, TimeUnit};

use super::columns::{drive, BigDecimalCol, BoolCol, BytesCol, Gather, IntCol, LongCol, RowHash};
use super::murmur3::{double_key, float_key, to_micros};
use crate::base::error::Error;

/// The largest decimal precision Spark hashes as a long (`Decimal.MAX_LONG_DIGITS`).
pub(super) const MAX_LONG_DIGITS: u8 = 18;

pub(super) const SUPPORTED: &str =
    "supported key types: Null, Boolean, Int8, Int16, Int32, Int64, Float32, Float64, \
    Date32, Date64, Timestamp, Duration, Interval(YearMonth), Decimal32/64/128/256, Utf8, LargeUtf8, \
    Utf8View, Binary, LargeBinary, BinaryView, FixedSizeBinary, Struct of these, Dictionary of \
    these (not of Struct or Dictionary)";

/// What to do with the kernel [`dispatch`] builds for a column.
pub(super) trait Visit {
    fn visit<R: RowHash>(self, r: R);
}

/// Hash every valid row in place.
pub(super) struct Apply<'a> {
    pub(super) nulls: Option<&'a NullBuffer>,
    pub(super) out: &'a mut [i32],
}

impl Visit for Apply<'_> {
    #[inline]
    fn visit<R: RowHash>(self, r: R) {
        drive(&r, self.nulls, self.out);
    }
}

/// Hash every valid row through dictionary keys.
pub(super) struct ApplyGather<'a> {
    pub(super) keys: &'a [usize],
    pub(super) nulls: Option<&'a NullBuffer>,
    pub(super) out: &'a mut [i32],
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

pub(super) fn unsupported(dt: &DataType, why: &str) -> Error {
    Error::InvalidArgument(format!("cannot hash a key column of type {dt}{why}; {SUPPORTED}"))
}

/// Builds the kernel for a flat (non-struct, non-dictionary) column and hands it to `v`.
pub(super) fn dispatch<V: Visit>(array: &dyn Array, v: V) -> Result<(), Error> {
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

pub(super) fn check_flat(dt: &DataType) -> Result<(), Error> {
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
