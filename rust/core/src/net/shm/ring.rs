//! A ring at an offset of a shared region: the region-backed form of
//! [`ByteRing`](crate::base::byte_ring::ByteRing) (the positions, the copies and the wake-up
//! protocol live there, where loom model-checks them).

use std::ops::Deref;
use std::sync::Arc;

use super::region::Region;
use crate::base::byte_ring::{ByteRing, RingHeader};

/// Bytes of a ring's header (a page; each word on its own cache line).
pub(crate) const RING_HEADER: usize = 4096;

const _: () = assert!(std::mem::size_of::<RingHeader>() <= RING_HEADER);

/// One ring at an offset of a region; either side's view of it.
pub(crate) struct Ring {
    ring: ByteRing,
    /// Keeps the mapping alive while the ring points into it.
    _region: Arc<Region>,
}

impl Ring {
    /// The ring at `offset` of `region` with `cap` data bytes (a power of two); panics if it
    /// does not fit (the caller lays the region out).
    pub(crate) fn new(region: Arc<Region>, offset: usize, cap: usize) -> Ring {
        assert!(cap.is_power_of_two());
        assert!(offset.is_multiple_of(RING_HEADER) && offset + RING_HEADER + cap <= region.len());
        // SAFETY: in bounds, checked above.
        let header = unsafe { region.base().add(offset) };
        // SAFETY: in bounds, checked above; the region is page aligned and `offset` a multiple
        // of a page, so the header is aligned; the mapping lives as long as `_region`, which
        // the ring holds; the link gives each ring one producer and one consumer.
        let ring = unsafe { ByteRing::from_raw(header.cast::<RingHeader>(), header.add(RING_HEADER), cap) };
        Ring {
            ring,
            _region: region,
        }
    }
}

impl Deref for Ring {
    type Target = ByteRing;

    fn deref(&self) -> &ByteRing {
        &self.ring
    }
}
