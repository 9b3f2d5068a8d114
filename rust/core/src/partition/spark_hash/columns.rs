//! Per-column kernels: one `RowHash` implementation per physical representation; the driver is
//! generic over it, so the type is matched once per column and the row loop is monomorphised.
//! On x86-64 CPUs with AVX2 the fixed-width kernels run in a copy compiled for AVX2.

use arrow_array::types::ByteArrayType;
use arrow_array::{Array, GenericByteArray, GenericByteViewArray};
use arrow_buffer::{i256, ArrowNativeType, BooleanBuffer, NullBuffer};

use super::murmur3::{
    fmix, hash_big_endian_minimal, mix_h1, mix_k1, murmur3_hash_bytes, murmur3_hash_int, murmur3_hash_long,
};

/// Hashes row `i` of one column, chained on `seed`.
pub(super) trait RowHash {
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
pub(super) const LANES: usize = 8;

/// A fixed-width column hashed with `hashInt(f(value))`.
pub(super) struct IntCol<'a, T, F> {
    pub(super) values: &'a [T],
    pub(super) f: F,
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
pub(super) struct LongCol<'a, T, F> {
    pub(super) values: &'a [T],
    pub(super) f: F,
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
pub(super) struct BoolCol<'a>(pub(super) &'a BooleanBuffer);

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
pub(super) struct BytesCol<A>(pub(super) A);

/// Random access to the bytes of a string or binary array.
pub(super) trait ByteSource {
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
pub(super) struct BigDecimalCol<'a, T>(pub(super) &'a [T]);

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
pub(super) struct Gather<'a, R> {
    pub(super) keys: &'a [usize],
    pub(super) inner: R,
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
pub(super) fn drive<R: RowHash>(r: &R, nulls: Option<&NullBuffer>, out: &mut [i32]) {
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
pub(super) fn drive_avx2<R: RowHash>(r: &R, nulls: Option<&NullBuffer>, out: &mut [i32]) {
    drive_generic(r, nulls, out);
}

#[inline(always)]
pub(super) fn drive_generic<R: RowHash>(r: &R, nulls: Option<&NullBuffer>, out: &mut [i32]) {
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
pub(super) fn drive_word<R: RowHash>(r: &R, valid: u64, base: usize, block: &mut [i32]) {
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
