//! Local pools (Flink's `LocalBufferPool`): one per partition or input gate, with a
//! guaranteed minimum and an elastic share of the global pool, and the segments they hand out
//! ([`PooledSegment`], [`Reservation`]), which recycle themselves when dropped.

use crate::base::error::{Error, Result};
use crate::base::sync::{Arc, Ordering};
use crate::base::wait::Wait;
use crate::memory::global::{GlobalPool, LocalShared, LocalState, PoolStats};
use crate::memory::segment::Segment;

impl GlobalPool {
    /// Creates a local pool with a guaranteed `min` and a share capped at `max`.
    /// `what` names the owner in errors; `hint` says which setting to change.
    pub fn create_local_pool(
        self: &Arc<Self>,
        what: impl Into<String>,
        min: usize,
        max: usize,
        hint: &str,
    ) -> Result<LocalPool> {
        let shared = self.register(what.into(), min, max, hint)?;
        Ok(LocalPool { shared })
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
        self.try_request_beyond(self.shared.overdraft.load(Ordering::SeqCst))
    }

    /// One segment now, whatever the pool holds beyond its share, as long as the global pool
    /// has one free without touching another pool's minimum (the global cap holds). For a
    /// spilled partition's reader whose consumer waits for it while the pool's segments sit
    /// in the read-ahead of readers nobody reads yet: one segment per such reader, given back
    /// to the global pool when recycled (the pool holds more than its share).
    pub fn try_request_one_more(&self) -> Option<PooledSegment> {
        let held = self.shared.held.load(Ordering::SeqCst);
        let share = self.shared.share.load(Ordering::SeqCst).max(1);
        self.try_request_beyond((held + 1).saturating_sub(share))
    }

    /// [`LocalPool::try_request_overdraft`] with an overdraft limit of `beyond` segments.
    fn try_request_beyond(&self, beyond: usize) -> Option<PooledSegment> {
        let sh = &self.shared;
        let mut st = sh.state.lock().unwrap();
        let seg = self.take_locked(&mut st, 1, beyond).ok().flatten()?.pop()?;
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
        let mut segs = st.spare.pop().unwrap_or_default();
        segs.extend(st.free.drain(at..));
        Ok(Some(segs))
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
        self.shared.global.segment_size()
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
        let segs = if n >= self.segs.len() {
            // All of them: the list itself moves (no allocation).
            std::mem::take(&mut self.segs)
        } else {
            self.segs.split_off(self.segs.len() - n)
        };
        Reservation {
            segs,
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
