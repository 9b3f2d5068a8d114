//! Expected values marked "Spark 4.0.1" were computed by Spark itself: pyspark 4.0.1 on
//! OpenJDK 17, `local[1]`, `spark.sql.session.timeZone=UTC`, e.g.
//! `spark.sql("select hash(cast(1 as int)), hash('abc'), ...").collect()`, and for the
//! data-driven checks non-foldable columns over `range(10000)` (so Spark's generated code
//! ran, not only constant folding). The script is quoted in `spark_data_driven_checksums`.

use super::columns::{drive, drive_generic, IntCol, LongCol};
use super::hasher::Pmod;
use super::murmur3::float_key;
use super::*;
use std::sync::Arc;

use arrow_array::types::Int32Type;
use arrow_array::Array;
use arrow_buffer::{i256, NullBuffer};
use arrow_schema::DataType;

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
        2 => Scalar::F64((!null).then_some([pick as f64 - 1e9, -0.0, f64::NAN, 0.5][(x >> 3) as usize % 4])),
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
