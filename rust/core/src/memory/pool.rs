//! The global pool (Flink's `NetworkBufferPool`) and local pools (`LocalBufferPool`).
//!
//! * The [`GlobalPool`] owns at most `total = memory / segment_size` segments, allocated
//!   lazily on first request and never more. Freed segments go back to its free list.
//! * A [`LocalPool`] belongs to one partition or one input gate. It is guaranteed `min`
//!   segments (checked at construction: [`Error::InsufficientBuffers`] if the minimums of all
//!   pools would exceed `total`) and may grow to its *share*: `min` plus an equal part of the
//!   segments nobody's minimum claims, capped at its `max`. Shares are recomputed whenever a
//!   pool is created or destroyed.
//! * Segments leave a local pool wrapped in a [`PooledSegment`]; dropping it recycles the
//!   segment: back to the local free list, or to the global pool while the local pool holds
//!   more than its share (or after it was destroyed).
//!
//! Locking: a local pool's mutex may be held while taking the global mutex, never the other
//! way round. The global pool wakes waiting local pools only after releasing its own lock.

use std::collections::HashMap;

use crate::base::error::{Error, Result};
use crate::base::sync::{Arc, AtomicUsize, Condvar, Mutex, Ordering};
use crate::base::wait::Wait;
use crate::memory::segment::Segment;

/// The process-wide (per environment) pool with a hard cap on segments.
pub struct GlobalPool {
    segment_size: usize,
    total: usize,
    /// Free list, allocation count and the registry of local pools. Held briefly; see the
    /// module docs for lock order.
    state: Mutex<GlobalState>,
}

struct GlobalState {
    /// Segments allocated once and now unused.
    free: Vec<Segment>,
    /// Segments ever allocated (`<= total`); the rest can still be allocated lazily.
    allocated: usize,
    /// Registered local pools by id, for redistribution, minimum reservations and wake-ups.
    pools: HashMap<u64, Arc<LocalShared>>,
    next_id: u64,
}

/// A snapshot of one pool's numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolStats {
    /// Guaranteed minimum.
    pub min: usize,
    /// Upper bound on the share.
    pub max: usize,
    /// Current share: how many segments this pool may hold.
    pub share: usize,
    /// Segments taken from the global pool (free here + in use).
    pub held: usize,
    /// Segments in use (handed out and not yet recycled).
    pub in_use: usize,
}

impl PoolStats {
    /// `in_use / share` (Flink's in/out pool usage), 0 for an empty pool. Can exceed 1 briefly
    /// after a redistribution shrank the share.
    pub fn usage(&self) -> f64 {
        if self.share == 0 {
            0.0
        } else {
            self.in_use as f64 / self.share as f64
        }
    }
}

impl GlobalPool {
    /// A pool of `memory / segment_size` segments of `segment_size` bytes; nothing is allocated yet.
    pub fn new(memory: usize, segment_size: usize) -> Result<Arc<GlobalPool>> {
        if segment_size < crate::memory::segment::MIN_SEGMENT_SIZE || !segment_size.is_power_of_two() {
            return Err(Error::InvalidArgument(format!(
                "segment_size must be a power of two of at least {} bytes, got {segment_size}",
                crate::memory::segment::MIN_SEGMENT_SIZE
            )));
        }
        let total = memory / segment_size;
        if total == 0 {
            return Err(Error::InvalidArgument(format!(
                "memory ({memory} bytes) is smaller than one segment ({segment_size} bytes)"
            )));
        }
        Ok(Arc::new(GlobalPool {
            segment_size,
            total,
            state: Mutex::new(GlobalState {
                free: Vec::new(),
                allocated: 0,
                pools: HashMap::new(),
                next_id: 0,
            }),
        }))
    }

    /// Bytes per segment.
    pub fn segment_size(&self) -> usize {
        self.segment_size
    }

    /// The hard cap on segments.
    pub fn total_segments(&self) -> usize {
        self.total
    }

    /// Segments not held by any local pool (free or not yet allocated).
    pub fn available_segments(&self) -> usize {
        let st = self.state.lock().unwrap();
        st.free.len() + (self.total - st.allocated)
    }

    /// Segments actually allocated so far (lazy allocation).
    pub fn allocated_segments(&self) -> usize {
        self.state.lock().unwrap().allocated
    }

    /// Sum of the minimums of all registered local pools.
    pub fn reserved_segments(&self) -> usize {
        self.state.lock().unwrap().pools.values().map(|p| p.min).sum()
    }

    /// Creates a local pool with a guaranteed `min` and a share capped at `max`.
    /// `what` names the owner in errors; `hint` says which setting to change.
    pub fn create_local_pool(
        self: &Arc<Self>,
        what: impl Into<String>,
        min: usize,
        max: usize,
        hint: &str,
    ) -> Result<LocalPool> {
        let what = what.into();
        let max = max.max(min);
        let shared = {
            let mut st = self.state.lock().unwrap();
            let reserved: usize = st.pools.values().map(|p| p.min).sum();
            let available = self.total - reserved;
            if min > available {
                return Err(Error::InsufficientBuffers {
                    what,
                    required: min,
                    available,
                    total: self.total,
                    segment_size: self.segment_size,
                    hint: hint.to_string(),
                });
            }
            let id = st.next_id;
            st.next_id += 1;
            let shared = Arc::new(LocalShared {
                id,
                what,
                min,
                max,
                global: self.clone(),
                share: AtomicUsize::new(min),
                held: AtomicUsize::new(0),
                overdraft: AtomicUsize::new(0),
                state: Mutex::new(LocalState {
                    free: Vec::new(),
                    destroyed: false,
                    waiters: 0,
                }),
                available: Condvar::new(),
            });
            st.pools.insert(id, shared.clone());
            shared
        };
        self.redistribute();
        Ok(LocalPool { shared })
    }

    /// Recomputes every pool's share: `min` plus an equal part of the unreserved segments,
    /// capped at `max`; what a capped pool cannot use goes to the others. Then trims free
    /// segments above the new shares and wakes pools whose share grew.
    fn redistribute(&self) {
        let pools: Vec<Arc<LocalShared>> = {
            let st = self.state.lock().unwrap();
            let mut pools: Vec<Arc<LocalShared>> = st.pools.values().cloned().collect();
            pools.sort_by_key(|p| p.id);
            let reserved: usize = pools.iter().map(|p| p.min).sum();
            let mut excess = self.total.saturating_sub(reserved);
            let mut shares: Vec<usize> = pools.iter().map(|p| p.min).collect();
            // Water-filling: hand out the excess evenly among pools still below their max.
            loop {
                let open: Vec<usize> = (0..pools.len()).filter(|&i| shares[i] < pools[i].max).collect();
                if open.is_empty() || excess == 0 {
                    break;
                }
                let each = (excess / open.len()).max(1);
                let mut given = 0;
                for &i in &open {
                    if excess == given {
                        break;
                    }
                    let take = each.min(pools[i].max - shares[i]).min(excess - given);
                    shares[i] += take;
                    given += take;
                }
                excess -= given;
                if given == 0 {
                    break;
                }
            }
            for (p, s) in pools.iter().zip(shares) {
                p.share.store(s, Ordering::SeqCst);
            }
            pools
        };
        for p in pools {
            p.trim_and_wake();
        }
    }

    /// Takes `k` segments for pool `requester` if the global pool can spare them without
    /// eating into other pools' unmet minimums. All or nothing.
    fn take(&self, requester: &LocalShared, k: usize) -> Option<Vec<Segment>> {
        let mut st = self.state.lock().unwrap();
        let avail = st.free.len() + (self.total - st.allocated);
        let unmet_others: usize = st
            .pools
            .values()
            .filter(|p| p.id != requester.id)
            .map(|p| p.min.saturating_sub(p.held.load(Ordering::SeqCst)))
            .sum();
        let held = requester.held.load(Ordering::SeqCst);
        let own_guaranteed = requester.min.saturating_sub(held).min(k);
        let beyond_min = k - own_guaranteed;
        if avail < k || avail - k < unmet_others && beyond_min > 0 {
            return None;
        }
        let mut out = Vec::with_capacity(k);
        while out.len() < k {
            match st.free.pop() {
                Some(seg) => out.push(seg),
                None => {
                    st.allocated += 1;
                    out.push(Segment::allocate(self.segment_size));
                }
            }
        }
        Some(out)
    }

    /// Returns segments to the free list and wakes local pools waiting for them.
    fn give_back(&self, segs: impl IntoIterator<Item = Segment>) {
        let pools: Vec<Arc<LocalShared>> = {
            let mut st = self.state.lock().unwrap();
            st.free.extend(segs);
            st.pools.values().cloned().collect()
        };
        for p in pools {
            p.wake();
        }
    }

    fn unregister(&self, id: u64) {
        self.state.lock().unwrap().pools.remove(&id);
        self.redistribute();
    }
}

impl std::fmt::Debug for GlobalPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GlobalPool")
            .field("segment_size", &self.segment_size)
            .field("total", &self.total)
            .field("available", &self.available_segments())
            .finish()
    }
}

pub(crate) struct LocalShared {
    id: u64,
    what: String,
    min: usize,
    max: usize,
    global: Arc<GlobalPool>,
    /// Current share; written by the global pool during redistribution, read under `state`.
    share: AtomicUsize,
    /// Segments taken from the global pool and not yet given back; written under `state`,
    /// read by the global pool to protect other pools' minimums.
    held: AtomicUsize,
    /// How many segments beyond its share the pool may borrow through
    /// [`LocalPool::try_request_overdraft`] (Flink's overdraft buffers).
    overdraft: AtomicUsize,
    /// Free segments of this pool and whether the owner destroyed it.
    state: Mutex<LocalState>,
    /// Signalled when a segment is recycled here, the global pool frees one, or the share grows.
    available: Condvar,
}

struct LocalState {
    free: Vec<Segment>,
    destroyed: bool,
    /// Threads blocked in `reserve`; the condvar is signalled only when this is > 0
    /// (a futex wake is a system call, and recycling is hot).
    waiters: usize,
}

impl LocalShared {
    /// Takes segments back: into the free list up to the share, the rest (or all, after
    /// `destroy`) to the global pool. One lock and at most one wake-up for the lot.
    fn recycle(&self, mut segs: Vec<Segment>) {
        if segs.is_empty() {
            return;
        }
        let mut st = self.state.lock().unwrap();
        let held = self.held.load(Ordering::SeqCst);
        let surplus = if st.destroyed {
            held
        } else {
            held.saturating_sub(self.share.load(Ordering::SeqCst))
        };
        let back: Vec<Segment> = segs.drain(segs.len() - surplus.min(segs.len())..).collect();
        self.held.store(held - back.len(), Ordering::SeqCst);
        let kept = !segs.is_empty();
        st.free.append(&mut segs);
        let wake = kept && st.waiters > 0;
        drop(st);
        if wake {
            self.available.notify_all();
        }
        if !back.is_empty() {
            self.global.give_back(back);
        }
    }

    fn trim_and_wake(&self) {
        let mut st = self.state.lock().unwrap();
        let share = self.share.load(Ordering::SeqCst);
        let held = self.held.load(Ordering::SeqCst);
        let surplus = held.saturating_sub(share).min(st.free.len());
        let keep = st.free.len() - surplus;
        let back: Vec<Segment> = st.free.drain(keep..).collect();
        self.held.store(held - surplus, Ordering::SeqCst);
        drop(st);
        if !back.is_empty() {
            // Only pools other than this one can use them; give_back wakes them.
            self.global.give_back(back);
        }
        self.available.notify_all();
    }

    fn wake(&self) {
        let st = self.state.lock().unwrap();
        if st.waiters > 0 {
            self.available.notify_all();
        }
    }
}

/// A partition's or gate's pool. Dropping it (or calling [`LocalPool::destroy`]) gives its
/// free segments back at once; segments still in use go back as they are recycled.
pub struct LocalPool {
    shared: Arc<LocalShared>,
}

impl LocalPool {
    /// Takes one segment, waiting as `wait` allows.
    pub fn request(&self, wait: &mut Wait<'_>) -> Result<PooledSegment> {
        Ok(self.request_many(1, wait)?.pop().expect("one segment"))
    }

    /// Takes one segment if one is available now.
    pub fn try_request(&self) -> Option<PooledSegment> {
        self.try_request_many(1)
            .map(|mut v| v.pop().expect("one segment"))
    }

    /// Takes `n` segments at once, all or nothing, waiting as `wait` allows. A request above
    /// the pool's current share is clamped to the share (a batch bigger than the pool passes
    /// through on its own). Returns fewer than `n` only in that case.
    pub fn request_many(&self, n: usize, wait: &mut Wait<'_>) -> Result<Vec<PooledSegment>> {
        Ok(self.reserve(n, wait)?.into_segments())
    }

    /// Like [`LocalPool::request_many`], as one [`Reservation`] that recycles all its
    /// segments at once when dropped (what a handed-off batch holds).
    pub fn reserve(&self, n: usize, wait: &mut Wait<'_>) -> Result<Reservation> {
        if let Some(r) = self.try_reserve_or_closed(n)? {
            return Ok(r);
        }
        loop {
            // The interrupt check may take the GIL, so it runs with no lock held: a Python
            // thread holding the GIL may be waiting for this pool's lock (metrics).
            let slice = wait.tick()?;
            let mut st = self.shared.state.lock().unwrap();
            if let Some(segs) = self.take_locked(&mut st, n, 0)? {
                return Ok(Reservation {
                    segs,
                    pool: self.shared.clone(),
                });
            }
            st.waiters += 1;
            let mut st = self.shared.available.wait_timeout(st, slice).unwrap().0;
            st.waiters -= 1;
            if let Some(segs) = self.take_locked(&mut st, n, 0)? {
                return Ok(Reservation {
                    segs,
                    pool: self.shared.clone(),
                });
            }
        }
    }

    fn try_reserve_or_closed(&self, n: usize) -> Result<Option<Reservation>> {
        let mut st = self.shared.state.lock().unwrap();
        Ok(self.take_locked(&mut st, n, 0)?.map(|segs| Reservation {
            segs,
            pool: self.shared.clone(),
        }))
    }

    /// [`LocalPool::reserve`] without waiting.
    pub fn try_reserve(&self, n: usize) -> Option<Reservation> {
        let mut st = self.shared.state.lock().unwrap();
        let segs = self.take_locked(&mut st, n, 0).ok().flatten()?;
        Some(Reservation {
            segs,
            pool: self.shared.clone(),
        })
    }

    /// Lets the pool borrow up to `n` segments beyond its share through
    /// [`LocalPool::try_request_overdraft`] (0, the default, turns overdraft off).
    pub fn set_overdraft(&self, n: usize) {
        self.shared.overdraft.store(n, Ordering::SeqCst);
    }

    /// One segment now, beyond the pool's share if need be: up to the overdraft limit, and
    /// only from segments the global pool has free without touching another pool's minimum
    /// (the global cap holds). A writer half-way through a record takes these to finish it
    /// instead of stalling mid-record; they go back to the global pool as soon as they are
    /// recycled (the pool holds more than its share), so usage can exceed 100% meanwhile.
    pub fn try_request_overdraft(&self) -> Option<PooledSegment> {
        let sh = &self.shared;
        let overdraft = sh.overdraft.load(Ordering::SeqCst);
        let mut st = sh.state.lock().unwrap();
        let seg = self.take_locked(&mut st, 1, overdraft).ok().flatten()?.pop()?;
        drop(st);
        Some(PooledSegment {
            seg: Some(seg),
            pool: sh.clone(),
        })
    }

    /// [`LocalPool::request_many`] without waiting: `None` if not available now.
    pub fn try_request_many(&self, n: usize) -> Option<Vec<PooledSegment>> {
        self.try_reserve(n).map(Reservation::into_segments)
    }

    /// `n` free segments (at most the share) under the state lock, topped up from the global
    /// pool while the pool holds at most its share plus `beyond_share` (the overdraft).
    fn take_locked(
        &self,
        st: &mut LocalState,
        n: usize,
        beyond_share: usize,
    ) -> Result<Option<Vec<Segment>>> {
        let sh = &self.shared;
        if st.destroyed {
            return Err(Error::Closed("buffer pool"));
        }
        let share = sh.share.load(Ordering::SeqCst).max(1);
        let n = n.min(share);
        if st.free.len() < n {
            let need = n - st.free.len();
            let held = sh.held.load(Ordering::SeqCst);
            if held + need > share + beyond_share {
                return Ok(None);
            }
            match sh.global.take(sh, need) {
                Some(segs) => {
                    sh.held.store(held + need, Ordering::SeqCst);
                    st.free.extend(segs);
                }
                None => return Ok(None),
            }
        }
        let at = st.free.len() - n;
        Ok(Some(st.free.drain(at..).collect()))
    }

    /// Numbers for metrics.
    pub fn stats(&self) -> PoolStats {
        let st = self.shared.state.lock().unwrap();
        let held = self.shared.held.load(Ordering::SeqCst);
        PoolStats {
            min: self.shared.min,
            max: self.shared.max,
            share: self.shared.share.load(Ordering::SeqCst),
            held,
            in_use: held - st.free.len(),
        }
    }

    /// The name given at construction.
    pub fn name(&self) -> &str {
        &self.shared.what
    }

    /// Bytes per segment.
    pub fn segment_size(&self) -> usize {
        self.shared.global.segment_size
    }

    /// Gives free segments back to the global pool, fails waiters with `Closed`, and
    /// unregisters the pool so the others' shares grow. Idempotent.
    pub fn destroy(&self) {
        let free = {
            let mut st = self.shared.state.lock().unwrap();
            if st.destroyed {
                return;
            }
            st.destroyed = true;
            let free: Vec<Segment> = st.free.drain(..).collect();
            self.shared.held.fetch_sub(free.len(), Ordering::SeqCst);
            free
        };
        self.shared.available.notify_all();
        self.shared.global.give_back(free);
        self.shared.global.unregister(self.shared.id);
    }
}

impl Drop for LocalPool {
    fn drop(&mut self) {
        self.destroy();
    }
}

impl std::fmt::Debug for LocalPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalPool")
            .field("name", &self.shared.what)
            .field("stats", &self.stats())
            .finish()
    }
}

/// A segment on loan from a local pool; dropping it recycles the segment.
pub struct PooledSegment {
    seg: Option<Segment>,
    pool: Arc<LocalShared>,
}

impl PooledSegment {
    /// The segment.
    pub fn segment(&self) -> &Segment {
        self.seg.as_ref().expect("present until drop")
    }

    /// The segment, mutably.
    pub fn segment_mut(&mut self) -> &mut Segment {
        self.seg.as_mut().expect("present until drop")
    }
}

impl Drop for PooledSegment {
    fn drop(&mut self) {
        if let Some(seg) = self.seg.take() {
            self.pool.recycle(vec![seg]);
        }
    }
}

/// Segments on loan from a local pool as one unit, recycled together when dropped.
pub struct Reservation {
    segs: Vec<Segment>,
    pool: Arc<LocalShared>,
}

impl Reservation {
    /// Number of segments held.
    pub fn len(&self) -> usize {
        self.segs.len()
    }

    /// True when no segment is held.
    pub fn is_empty(&self) -> bool {
        self.segs.is_empty()
    }

    /// Moves the last `n` segments (or all, if fewer) into a reservation of their own.
    pub fn split_off(&mut self, n: usize) -> Reservation {
        let at = self.segs.len() - n.min(self.segs.len());
        Reservation {
            segs: self.segs.split_off(at),
            pool: self.pool.clone(),
        }
    }

    /// Separate loans, one per segment (to build buffers from).
    pub fn into_segments(mut self) -> Vec<PooledSegment> {
        let pool = self.pool.clone();
        std::mem::take(&mut self.segs)
            .into_iter()
            .map(|seg| PooledSegment {
                seg: Some(seg),
                pool: pool.clone(),
            })
            .collect()
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.pool.recycle(std::mem::take(&mut self.segs));
    }
}

impl std::fmt::Debug for Reservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservation")
            .field("segments", &self.segs.len())
            .field("pool", &self.pool.what)
            .finish()
    }
}

impl std::fmt::Debug for PooledSegment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PooledSegment")
            .field("pool", &self.pool.what)
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::time::Duration;

    const SEG: usize = 4096;

    fn no_wait() -> Wait<'static> {
        Wait::timeout(Some(Duration::from_millis(20)), "test")
    }

    #[test]
    fn global_pool_allocates_lazily_up_to_the_cap() {
        let g = GlobalPool::new(10 * SEG, SEG).unwrap();
        assert_eq!(g.total_segments(), 10);
        assert_eq!(g.allocated_segments(), 0);
        let p = g.create_local_pool("p", 1, usize::MAX, "").unwrap();
        let segs = p.request_many(4, &mut no_wait()).unwrap();
        assert_eq!(g.allocated_segments(), 4);
        let more = p.request_many(6, &mut no_wait()).unwrap();
        assert_eq!(g.allocated_segments(), 10);
        assert!(p.try_request().is_none(), "the cap holds");
        drop((segs, more));
        assert_eq!(p.stats().in_use, 0);
    }

    #[test]
    fn insufficient_minimum_fails_at_construction_with_numbers() {
        let g = GlobalPool::new(8 * SEG, SEG).unwrap();
        let _a = g.create_local_pool("a", 5, usize::MAX, "").unwrap();
        let err = g
            .create_local_pool("gate b", 4, usize::MAX, "increase memory")
            .unwrap_err();
        match err {
            Error::InsufficientBuffers {
                required,
                available,
                total,
                ref hint,
                ..
            } => {
                assert_eq!((required, available, total), (4, 3, 8));
                assert_eq!(hint, "increase memory");
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn shares_are_redistributed_on_create_and_destroy() {
        let g = GlobalPool::new(100 * SEG, SEG).unwrap();
        let a = g.create_local_pool("a", 10, usize::MAX, "").unwrap();
        assert_eq!(a.stats().share, 100);
        let b = g.create_local_pool("b", 20, usize::MAX, "").unwrap();
        assert_eq!(a.stats().share, 10 + 35);
        assert_eq!(b.stats().share, 20 + 35);
        let c = g.create_local_pool("c", 0, 5, "").unwrap();
        assert_eq!(c.stats().share, 5, "capped at max; the rest goes to the others");
        assert_eq!(a.stats().share + b.stats().share + c.stats().share, 100);
        drop(b);
        assert_eq!(a.stats().share + c.stats().share, 100);
        assert_eq!(c.stats().share, 5);
    }

    #[test]
    fn recycled_segments_above_the_share_go_back_to_the_global_pool() {
        let g = GlobalPool::new(10 * SEG, SEG).unwrap();
        let a = g.create_local_pool("a", 2, usize::MAX, "").unwrap();
        let segs = a.request_many(10, &mut no_wait()).unwrap();
        assert_eq!(g.available_segments(), 0);
        let b = g.create_local_pool("b", 2, usize::MAX, "").unwrap();
        assert_eq!(a.stats().share, 5);
        // b's minimum is guaranteed even though a holds everything right now: a must give
        // back as it recycles.
        assert!(b.try_request().is_none());
        drop(segs);
        assert_eq!(a.stats().held, 5, "a keeps only its share");
        assert_eq!(b.request_many(4, &mut no_wait()).unwrap().len(), 4);
    }

    #[test]
    fn a_pool_cannot_take_another_pools_minimum() {
        let g = GlobalPool::new(10 * SEG, SEG).unwrap();
        let a = g.create_local_pool("a", 1, 8, "").unwrap();
        let b = g.create_local_pool("b", 4, 4, "").unwrap();
        // a's share is 6 (1 + the 5 unreserved); b's 4 are protected.
        let held = a.request_many(6, &mut no_wait()).unwrap();
        assert_eq!(held.len(), 6);
        assert_eq!(b.request_many(4, &mut no_wait()).unwrap().len(), 4);
    }

    #[test]
    fn oversized_requests_are_clamped_to_the_share() {
        let g = GlobalPool::new(4 * SEG, SEG).unwrap();
        let a = g.create_local_pool("a", 1, usize::MAX, "").unwrap();
        assert_eq!(a.request_many(100, &mut no_wait()).unwrap().len(), 4);
    }

    #[test]
    fn blocked_request_times_out_and_wakes_on_recycle() {
        let g = GlobalPool::new(2 * SEG, SEG).unwrap();
        let a = g.create_local_pool("a", 1, usize::MAX, "").unwrap();
        let held = a.request_many(2, &mut no_wait()).unwrap();
        assert!(matches!(a.request(&mut no_wait()), Err(Error::Timeout(..))));
        std::thread::scope(|s| {
            let h = s.spawn(|| a.request(&mut Wait::timeout(Some(Duration::from_secs(10)), "t")));
            std::thread::sleep(Duration::from_millis(30));
            drop(held);
            assert!(h.join().unwrap().is_ok());
        });
    }

    #[test]
    fn destroy_returns_free_segments_and_fails_waiters() {
        let g = GlobalPool::new(4 * SEG, SEG).unwrap();
        let a = g.create_local_pool("a", 1, usize::MAX, "").unwrap();
        let s = a.request_many(3, &mut no_wait()).unwrap();
        drop(s);
        assert_eq!(g.available_segments(), 1);
        a.destroy();
        assert_eq!(g.available_segments(), 4);
        assert!(matches!(a.request(&mut no_wait()), Err(Error::Closed(_))));
    }

    #[test]
    fn interrupt_check_aborts_a_wait() {
        let g = GlobalPool::new(SEG, SEG).unwrap();
        let a = g.create_local_pool("a", 1, usize::MAX, "").unwrap();
        let _held = a.request(&mut no_wait()).unwrap();
        let mut calls = 0;
        let mut check = || {
            calls += 1;
            if calls > 2 {
                Err(Error::Interrupted)
            } else {
                Ok(())
            }
        };
        let mut wait = Wait::timeout(None, "t").with_check(&mut check);
        assert!(matches!(a.request(&mut wait), Err(Error::Interrupted)));
    }
}

#[cfg(all(test, not(loom)))]
mod proptests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Create { min: usize, max: usize },
        Destroy(usize),
        Request { pool: usize, n: usize },
        Recycle { pool: usize, n: usize },
        Overdraft { pool: usize },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0usize..6, 0usize..20).prop_map(|(min, extra)| Op::Create {
                min,
                max: min + extra
            }),
            (0usize..8).prop_map(Op::Destroy),
            (0usize..8, 1usize..8).prop_map(|(pool, n)| Op::Request { pool, n }),
            (0usize..8, 1usize..8).prop_map(|(pool, n)| Op::Recycle { pool, n }),
            (0usize..8).prop_map(|pool| Op::Overdraft { pool }),
        ]
    }

    proptest! {
        /// Whatever happens, no more than `total` segments exist, every segment is accounted
        /// for exactly once, and minimums never exceed the total.
        #[test]
        fn segments_are_conserved_and_capped(ops in proptest::collection::vec(op(), 1..80)) {
            let g = GlobalPool::new(24 * 4096, 4096).unwrap();
            let mut pools: Vec<(LocalPool, Vec<PooledSegment>)> = Vec::new();
            for op in ops {
                match op {
                    Op::Create { min, max } => {
                        let reserved = g.reserved_segments();
                        match g.create_local_pool("p", min, max, "") {
                            Ok(p) => pools.push((p, Vec::new())),
                            Err(Error::InsufficientBuffers { .. }) => prop_assert!(reserved + min > 24),
                            Err(e) => prop_assert!(false, "{e}"),
                        }
                    }
                    Op::Destroy(i) if i < pools.len() => { pools.remove(i); }
                    Op::Request { pool, n } if pool < pools.len() => {
                        if let Some(segs) = pools[pool].0.try_request_many(n) {
                            pools[pool].1.extend(segs);
                        }
                    }
                    Op::Overdraft { pool } if pool < pools.len() => {
                        pools[pool].0.set_overdraft(3);
                        let before = pools[pool].0.stats();
                        match pools[pool].0.try_request_overdraft() {
                            Some(seg) => {
                                prop_assert!(before.in_use < before.share.max(1) + 3);
                                pools[pool].1.push(seg);
                            }
                            // Refused only at the limit, or when the global pool has nothing
                            // to lend beyond other pools' unmet minimums.
                            None => {
                                let unmet_others: usize = pools
                                    .iter()
                                    .enumerate()
                                    .filter(|(i, _)| *i != pool)
                                    .map(|(_, (p, _))| p.stats().min.saturating_sub(p.stats().held))
                                    .sum();
                                prop_assert!(
                                    before.held >= before.share.max(1) + 3
                                        || g.available_segments() <= unmet_others,
                                    "refused below the limit with {} free and {} unmet",
                                    g.available_segments(),
                                    unmet_others
                                );
                            }
                        }
                    }
                    Op::Recycle { pool, n } if pool < pools.len() => {
                        let v = &mut pools[pool].1;
                        let keep = v.len().saturating_sub(n);
                        v.truncate(keep);
                    }
                    _ => {}
                }
                prop_assert!(g.allocated_segments() <= 24);
                let held: usize = pools.iter().map(|(p, _)| p.stats().held).sum();
                prop_assert_eq!(held + g.available_segments(), 24);
                let in_use: usize = pools.iter().map(|(_, v)| v.len()).sum();
                let stats_in_use: usize = pools.iter().map(|(p, _)| p.stats().in_use).sum();
                prop_assert_eq!(in_use, stats_in_use);
                let shares: usize = pools.iter().map(|(p, _)| p.stats().share).sum();
                prop_assert!(shares <= 24);
            }
            drop(pools);
            prop_assert_eq!(g.available_segments(), 24);
        }
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;

    /// Two threads compete for one segment while the holder recycles it: nobody loses a
    /// segment and both requests eventually succeed.
    #[test]
    fn loom_pool_request_and_recycle() {
        loom::model(|| {
            let g = GlobalPool::new(4096, 4096).unwrap();
            let p = Arc::new(g.create_local_pool("p", 1, 1, "").unwrap());
            let first = p.try_request().unwrap();
            let p2 = p.clone();
            let t = loom::thread::spawn(move || {
                let s = p2.try_request();
                drop(s);
            });
            drop(first);
            t.join().unwrap();
            assert_eq!(p.stats().in_use, 0);
            assert_eq!(p.stats().held + g.available_segments(), 1);
        });
    }
}
