//! Murmur3 x86_32 as Spark's `org.apache.spark.unsafe.hash.Murmur3_x86_32` computes it, and
//! the scalar conversions Spark applies before hashing (float bits, decimals as big-endian
//! bytes, timestamps as microseconds).

/// The seed Spark's `hash()` and `HashPartitioning` start from.
pub const SPARK_HASH_SEED: i32 = 42;

const C1: u32 = 0xcc9e_2d51;
const C2: u32 = 0x1b87_3593;

#[inline(always)]
pub(super) fn mix_k1(k1: i32) -> u32 {
    (k1 as u32).wrapping_mul(C1).rotate_left(15).wrapping_mul(C2)
}

#[inline(always)]
pub(super) fn mix_h1(h1: u32, k1: u32) -> u32 {
    (h1 ^ k1)
        .rotate_left(13)
        .wrapping_mul(5)
        .wrapping_add(0xe654_6b64)
}

#[inline(always)]
pub(super) fn fmix(h1: u32, len: u32) -> i32 {
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
pub(super) fn float_key(v: f32) -> i32 {
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
pub(super) fn double_key(v: f64) -> i64 {
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
pub(super) fn hash_big_endian_minimal(be: &[u8], seed: i32) -> i32 {
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
pub(super) fn to_micros<const UNIT: u8>(v: i64) -> i64 {
    match UNIT {
        0 => v.wrapping_mul(1_000_000),
        1 => v.wrapping_mul(1_000),
        2 => v,
        _ => v.div_euclid(1_000),
    }
}
