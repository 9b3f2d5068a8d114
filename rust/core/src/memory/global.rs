//! The global pool (Flink's `NetworkBufferPool`): a hard cap on segments, allocated lazily,
//! and the registry of local pools' shared state ([`LocalShared`]), whose shares it
//! redistributes. The local pools' handles are [`super::local`]'s.

use std::collections::HashMap;

use crate::base::error::{Error, Result};
use crate::base::sync::{Arc, AtomicUsize, Condvar, Mutex, Ordering};
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
    /// Segments held for data kept outside the pools ([`HeldOutside`]): neither handed to a
    /// pool nor kept allocated.
    outside: usize,
}

impl GlobalState {
    /// Segments the pools may have: the cap less what is held outside.
    fn usable(&self, total: usize) -> usize {
        total.saturating_sub(self.outside)
    }

    /// Drops free segments while more are allocated than the pools may have.
    fn trim_free(&mut self, total: usize) {
        while self.allocated > self.usable(total) && self.free.pop().is_some() {
            self.allocated -= 1;
        }
    }
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
                outside: 0,
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

    /// Segments not held by any local pool (free or not yet allocated), less those held outside.
    pub fn available_segments(&self) -> usize {
        let st = self.state.lock().unwrap();
        st.free.len() + st.usable(self.total).saturating_sub(st.allocated)
    }

    /// Segments actually allocated so far (lazy allocation).
    pub fn allocated_segments(&self) -> usize {
        self.state.lock().unwrap().allocated
    }

    /// Sum of the minimums of all registered local pools, and the segments held outside them.
    pub fn reserved_segments(&self) -> usize {
        let st = self.state.lock().unwrap();
        st.pools.values().map(|p| p.min).sum::<usize>() + st.outside
    }

    /// Holds `segments` for data its owner keeps outside the pools: the pools' shares shrink
    /// by as much (spillable partitions spill down to fit) and free segments beyond what
    /// the pools may still have are dropped, so allocated segments plus those held outside
    /// stay within the cap. [`Error::InsufficientBuffers`] when the pools' minimums leave less.
    pub fn hold_outside(self: &Arc<Self>, what: &str, segments: usize, hint: &str) -> Result<HeldOutside> {
        {
            let mut st = self.state.lock().unwrap();
            let reserved: usize = st.pools.values().map(|p| p.min).sum();
            let available = st.usable(self.total).saturating_sub(reserved);
            if segments > available {
                return Err(Error::InsufficientBuffers {
                    what: what.to_string(),
                    required: segments,
                    available,
                    total: self.total,
                    segment_size: self.segment_size,
                    hint: hint.to_string(),
                });
            }
            st.outside += segments;
            st.trim_free(self.total);
        }
        self.redistribute();
        Ok(HeldOutside {
            global: self.clone(),
            segments,
        })
    }

    /// Registers the shared state of a new local pool with a guaranteed `min` and a share
    /// capped at `max` (see [`GlobalPool::create_local_pool`]).
    pub(super) fn register(
        self: &Arc<Self>,
        what: String,
        min: usize,
        max: usize,
        hint: &str,
    ) -> Result<Arc<LocalShared>> {
        let max = max.max(min);
        let shared = {
            let mut st = self.state.lock().unwrap();
            let reserved: usize = st.pools.values().map(|p| p.min).sum();
            let available = st.usable(self.total).saturating_sub(reserved);
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
                    spare: Vec::new(),
                    destroyed: false,
                    waiters: 0,
                }),
                available: Condvar::new(),
            });
            st.pools.insert(id, shared.clone());
            shared
        };
        self.redistribute();
        Ok(shared)
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
            let mut excess = st.usable(self.total).saturating_sub(reserved);
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
    pub(super) fn take(&self, requester: &LocalShared, k: usize) -> Option<Vec<Segment>> {
        let mut st = self.state.lock().unwrap();
        let avail = st.free.len() + st.usable(self.total).saturating_sub(st.allocated);
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
    pub(super) fn give_back(&self, segs: impl IntoIterator<Item = Segment>) {
        let pools: Vec<Arc<LocalShared>> = {
            let mut st = self.state.lock().unwrap();
            st.free.extend(segs);
            st.trim_free(self.total);
            st.pools.values().cloned().collect()
        };
        for p in pools {
            p.wake();
        }
    }

    pub(super) fn unregister(&self, id: u64) {
        self.state.lock().unwrap().pools.remove(&id);
        self.redistribute();
    }
}

/// Segments held outside the pools by [`GlobalPool::hold_outside`]; dropping it gives them back.
pub struct HeldOutside {
    global: Arc<GlobalPool>,
    segments: usize,
}

impl HeldOutside {
    /// The segments held.
    pub fn segments(&self) -> usize {
        self.segments
    }
}

impl Drop for HeldOutside {
    fn drop(&mut self) {
        {
            let mut st = self.global.state.lock().unwrap();
            st.outside -= self.segments;
        }
        self.global.redistribute();
    }
}

impl std::fmt::Debug for HeldOutside {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldOutside")
            .field("segments", &self.segments)
            .finish()
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
    pub(super) id: u64,
    pub(super) what: String,
    pub(super) min: usize,
    pub(super) max: usize,
    pub(super) global: Arc<GlobalPool>,
    /// Current share; written by the global pool during redistribution, read under `state`.
    pub(super) share: AtomicUsize,
    /// Segments taken from the global pool and not yet given back; written under `state`,
    /// read by the global pool to protect other pools' minimums.
    pub(super) held: AtomicUsize,
    /// How many segments beyond its share the pool may borrow through
    /// [`LocalPool::try_request_overdraft`] (Flink's overdraft buffers).
    pub(super) overdraft: AtomicUsize,
    /// Free segments of this pool and whether the owner destroyed it.
    pub(super) state: Mutex<LocalState>,
    /// Signalled when a segment is recycled here, the global pool frees one, or the share grows.
    pub(super) available: Condvar,
}

/// Empty lists of segments kept for the next reservation (see [`LocalState::spare`]).
const SPARE_LISTS: usize = 8;

pub(super) struct LocalState {
    pub(super) free: Vec<Segment>,
    /// Emptied lists of recycled reservations, kept for the next ones: a batch's reservation
    /// lists a segment per 32 KiB, and allocating that list for every write (a kilobyte or
    /// more for a batch of megabytes) made the allocator tidy its free lists every time.
    pub(super) spare: Vec<Vec<Segment>>,
    pub(super) destroyed: bool,
    /// Threads blocked in `reserve`; the condvar is signalled only when this is > 0
    /// (a futex wake is a system call, and recycling is hot).
    pub(super) waiters: usize,
}

impl LocalShared {
    /// Takes segments back: into the free list up to the share, the rest (or all, after
    /// `destroy`) to the global pool. One lock and at most one wake-up for the lot.
    pub(super) fn recycle(&self, mut segs: Vec<Segment>) {
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
        if segs.capacity() > 1 && st.spare.len() < SPARE_LISTS {
            st.spare.push(segs);
        }
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
