//! Which chunks of a shared heap are in use: one bit per chunk in words someone else owns
//! (the shared region of a same-host link, or a test's allocation). One side allocates (the
//! producer, which then writes the chunks), the other frees (the consumer, once nothing it
//! holds points into them any more), and neither ever waits for the other.
//!
//! Only the allocator sets bits and only the freeing side clears them, so a bit the allocator
//! sees clear stays clear until it sets it itself: it can pick a run from a snapshot of the
//! words. The freeing side clears with `Release` after its last read of the chunks, the
//! allocator loads with `Acquire` before it writes them again, so every read of a chunk's old
//! bytes happens before any write of new ones. The loom model at the end of this file checks
//! that no write to a chunk overlaps a read of it.
//!
//! The peer may write anything into the words. Setting bits only makes the allocator find less
//! room; clearing bits of chunks the peer still reads only hurts the peer. No index outside
//! the map is ever touched.

use crate::base::sync::{AtomicU64, Ordering};

/// Either side's view of a map of `chunks` bits.
pub(crate) struct ChunkMap {
    words: *const AtomicU64,
    chunks: usize,
}

// SAFETY: the words are atomics; the map only ever accesses them through atomic operations.
unsafe impl Send for ChunkMap {}
// SAFETY: as above.
unsafe impl Sync for ChunkMap {}

impl ChunkMap {
    /// Words (`u64`) a map of `chunks` chunks takes.
    pub(crate) const fn words_for(chunks: usize) -> usize {
        chunks.div_ceil(64)
    }

    /// The map over `words_for(chunks)` words at `words`.
    ///
    /// # Safety
    /// `words` must point to that many atomics, aligned, valid for as long as the map lives.
    pub(crate) unsafe fn from_raw(words: *const AtomicU64, chunks: usize) -> ChunkMap {
        ChunkMap { words, chunks }
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        debug_assert!(i < Self::words_for(self.chunks));
        // SAFETY: `i` is within the words the caller of `from_raw` vouched for.
        unsafe { &*self.words.add(i) }
    }

    /// Allocating side: the lowest run of `n` chunks that are all free, marked in use; `None`
    /// when there is none (or `n` is 0). Lowest first keeps the chunks in use few and warm
    /// in the caches.
    pub(crate) fn alloc(&self, n: usize) -> Option<usize> {
        if n == 0 || n > self.chunks {
            return None;
        }
        let words: Vec<u64> = (0..Self::words_for(self.chunks))
            .map(|i| self.word(i).load(Ordering::Acquire))
            .collect();
        let used = |c: usize| words[c / 64] >> (c % 64) & 1 == 1;
        let mut run = 0;
        let mut first = None;
        for c in 0..self.chunks {
            if used(c) {
                run = 0;
                continue;
            }
            run += 1;
            if run == n {
                first = Some(c + 1 - n);
                break;
            }
        }
        let first = first?;
        self.update(first, n, |w, mask| {
            w.fetch_or(mask, Ordering::AcqRel);
        });
        Some(first)
    }

    /// Freeing side: chunks `first..first + n` are free again. Every read of them must be
    /// done (this is the `Release` the allocator's next `Acquire` pairs with). Out-of-range
    /// chunks are ignored.
    pub(crate) fn free(&self, first: usize, n: usize) {
        let end = first.saturating_add(n).min(self.chunks);
        if first >= end {
            return;
        }
        self.update(first, end - first, |w, mask| {
            w.fetch_and(!mask, Ordering::Release);
        });
    }

    /// Allocating side: whether chunk `c` is free (the freeing side cleared it; it stays so
    /// until this side allocates it again). Out of range: false.
    pub(crate) fn is_free(&self, c: usize) -> bool {
        c < self.chunks && self.word(c / 64).load(Ordering::Acquire) >> (c % 64) & 1 == 0
    }

    /// Chunks in the map.
    pub(crate) fn chunks(&self) -> usize {
        self.chunks
    }

    /// Chunks in use now (a snapshot).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn in_use(&self) -> usize {
        let full = (0..Self::words_for(self.chunks))
            .map(|i| self.word(i).load(Ordering::Acquire).count_ones() as usize)
            .sum::<usize>();
        // Bits past the last chunk are not chunks (a peer may have set them).
        let tail = self.chunks % 64;
        if tail == 0 {
            return full;
        }
        let last = self.word(self.chunks / 64).load(Ordering::Acquire);
        full - (last >> tail).count_ones() as usize
    }

    /// Applies `op` with the mask of each word's share of chunks `first..first + n`.
    fn update(&self, first: usize, n: usize, op: impl Fn(&AtomicU64, u64)) {
        let mut c = first;
        let end = first + n;
        while c < end {
            let bit = c % 64;
            let take = (64 - bit).min(end - c);
            let mask = if take == 64 {
                u64::MAX
            } else {
                ((1u64 << take) - 1) << bit
            };
            op(self.word(c / 64), mask);
            c += take;
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn map(words: &[AtomicU64], chunks: usize) -> ChunkMap {
        assert!(words.len() >= ChunkMap::words_for(chunks));
        // SAFETY: the words outlive the map in each test.
        unsafe { ChunkMap::from_raw(words.as_ptr(), chunks) }
    }

    #[test]
    fn runs_are_lowest_first_and_never_overlap() {
        let words: Vec<AtomicU64> = (0..3).map(|_| AtomicU64::new(0)).collect();
        let m = map(&words, 130);
        assert_eq!(m.alloc(3), Some(0));
        assert_eq!(m.alloc(62), Some(3));
        // Across a word boundary.
        assert_eq!(m.alloc(5), Some(65));
        assert_eq!(m.in_use(), 70);
        m.free(3, 62);
        assert_eq!(m.alloc(2), Some(3));
        // Free runs now: 5..65 and 70..130, 60 chunks each.
        assert_eq!(m.alloc(61), None);
        assert_eq!(m.alloc(1), Some(5));
        // Nothing left of 200, and zero is never a run.
        assert_eq!(m.alloc(200), None);
        assert_eq!(m.alloc(0), None);
    }

    #[test]
    fn a_full_map_refuses_until_freed_and_bits_past_the_end_do_not_count() {
        let words: Vec<AtomicU64> = (0..2).map(|_| AtomicU64::new(0)).collect();
        let m = map(&words, 70);
        assert_eq!(m.alloc(70), Some(0));
        assert_eq!(m.alloc(1), None);
        assert_eq!(m.in_use(), 70);
        m.free(10, 5);
        assert_eq!(m.alloc(6), None);
        assert_eq!(m.alloc(5), Some(10));
        // Freeing past the end touches nothing outside the map.
        m.free(60, 1_000);
        assert_eq!(m.in_use(), 60);
        // A peer that sets bits past the last chunk changes nothing we count or hand out.
        words[1].fetch_or(u64::MAX << 6, Ordering::SeqCst);
        assert_eq!(m.in_use(), 60);
        assert_eq!(m.alloc(10), Some(60));
        assert_eq!(m.alloc(1), None);
    }

    #[test]
    fn random_allocations_and_frees_match_a_model() {
        let words: Vec<AtomicU64> = (0..4).map(|_| AtomicU64::new(0)).collect();
        let m = map(&words, 200);
        let mut model = [false; 200];
        let mut live: Vec<(usize, usize)> = Vec::new();
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n) as usize
        };
        for _ in 0..5_000 {
            if live.is_empty() || next(3) > 0 {
                let n = 1 + next(20);
                let want = (0..=200 - n).find(|&f| model[f..f + n].iter().all(|u| !u));
                let got = m.alloc(n);
                assert_eq!(got, want, "alloc({n})");
                if let Some(f) = got {
                    model[f..f + n].iter_mut().for_each(|u| *u = true);
                    live.push((f, n));
                }
            } else {
                let (f, n) = live.swap_remove(next(live.len() as u64));
                m.free(f, n);
                model[f..f + n].iter_mut().for_each(|u| *u = false);
            }
            assert_eq!(m.in_use(), model.iter().filter(|u| **u).count());
        }
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    //! The producer allocates a chunk, writes and publishes it; the consumer reads and frees
    //! it, on another thread; the producer allocates both chunks (possible only after the
    //! free) and writes them.
    //! loom's cells report any write that is not ordered after the consumer's read.

    use super::*;
    use loom::cell::UnsafeCell;
    use loom::sync::Arc;

    struct Shared {
        words: [AtomicU64; 1],
        chunks: [UnsafeCell<u8>; 2],
        /// The "ring": which chunk the producer published (0 = nothing yet).
        published: AtomicU64,
    }

    // SAFETY: loom's cells and atomics; the chunk discipline is what the model checks.
    unsafe impl Send for Shared {}
    // SAFETY: as above.
    unsafe impl Sync for Shared {}

    fn map(s: &Shared) -> ChunkMap {
        // SAFETY: `s` outlives every map made from it (the `Arc`s below).
        unsafe { ChunkMap::from_raw(s.words.as_ptr(), 2) }
    }

    #[test]
    fn loom_chunks_are_never_written_while_the_consumer_reads_them() {
        loom::model(|| {
            let s = Arc::new(Shared {
                words: [AtomicU64::new(0)],
                chunks: [UnsafeCell::new(0), UnsafeCell::new(0)],
                published: AtomicU64::new(0),
            });
            let c = s.clone();
            let consumer = loom::thread::spawn(move || {
                let m = map(&c);
                let mut seen = 0;
                while seen == 0 {
                    seen = c.published.load(Ordering::Acquire);
                    loom::thread::yield_now();
                }
                let chunk = (seen - 1) as usize;
                // SAFETY: loom checks this read against the producer's writes.
                let v = c.chunks[chunk].with(|p| unsafe { *p });
                assert_eq!(v, 7);
                m.free(chunk, 1);
            });
            let m = map(&s);
            let first = m.alloc(1).expect("an empty map has room");
            // SAFETY: loom checks this write against the consumer's read.
            s.chunks[first].with_mut(|p| unsafe { *p = 7 });
            s.published.store(first as u64 + 1, Ordering::Release);
            // Both chunks at once: possible only once the consumer freed the first.
            loop {
                if let Some(c) = m.alloc(2) {
                    assert_eq!(c, first);
                    // SAFETY: loom checks these writes against the consumer's read.
                    s.chunks[0].with_mut(|p| unsafe { *p = 9 });
                    s.chunks[1].with_mut(|p| unsafe { *p = 9 });
                    break;
                }
                loom::thread::yield_now();
            }
            consumer.join().unwrap();
        });
    }
}
