//! The link's heap: chunks of the shared region where the producer puts a whole record (a
//! handed-off batch's IPC bytes) at once, so the consumer can decode it where it lies instead
//! of copying it out of the ring. The frames that carry the record (one per buffer, with the
//! same credit, backlog and sequence numbers as over TCP) then name places in the heap instead
//! of carrying bytes (`Message::SharedBuffer`).
//!
//! Who frees what: the producer allocates a run of chunks ([`ChunkMap`]), writes the record
//! into it and never touches it again; the consumer frees the run once it has read every frame
//! of it and dropped every batch built on it ([`HeapLease`]). So a batch a user holds never
//! changes under it, however long it is held; a heap filled with held batches only makes the
//! producer send the next records inline, through the ring, as before.
//!
//! The channels of a link share its heap, and a consumer that stops reading keeps what it was
//! sent. So that one stalled channel cannot take the heap from the others, the producer keeps
//! a ledger of the items it placed and whom for: while the link serves more than one channel,
//! a channel that holds items may place more only within half the heap (a link's only channel
//! may use all of it).

use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use arrow_buffer::Buffer;

use super::region::Region;
use crate::base::chunk_map::ChunkMap;
use crate::base::sync::AtomicU64;
use crate::serde::RECORD_HEADER_LEN;

/// Bytes per chunk of the heap.
pub(crate) const HEAP_CHUNK: usize = 64 << 10;
/// Most bytes of heap a link's region has (its pages are only used once written).
pub(crate) const HEAP_BYTES: usize = 32 << 20;
/// Fewest chunks worth a heap: below, records go inline.
const MIN_HEAP_CHUNKS: usize = 4;
/// Bytes before the heap's chunks: the chunk map, on a page of its own.
pub(crate) const HEAP_HEADER: usize = 4096;
/// Largest heap a client accepts from a server's layout.
pub(crate) const MAX_HEAP_BYTES: usize = 1 << 30;
/// Where an item starts in its first chunk: after the item's 8-byte record length prefix the
/// record starts on a 64-byte boundary, as aligned as in a buffer of its own.
pub(crate) const ITEM_PAD: usize = 64 - RECORD_HEADER_LEN;
/// Items shorter than this go inline through the ring (copying them costs less than a chunk).
pub(crate) const MIN_ITEM: usize = HEAP_CHUNK;

const _: () = assert!(ChunkMap::words_for(MAX_HEAP_BYTES / HEAP_CHUNK) * 8 <= HEAP_HEADER);

/// Region bytes a heap of `heap` bytes takes (header included).
pub(crate) const fn heap_region_len(heap: usize) -> usize {
    HEAP_HEADER + heap
}

/// The heap of each link a producer environment with `memory` bytes of segments serves: a
/// quarter of `memory`, at most [`HEAP_BYTES`]; none (0) when that is under four chunks. Its
/// pages are memory besides `memory`, used once records are placed.
pub(crate) fn heap_bytes_for(memory: usize) -> usize {
    let heap = (memory / 4 / HEAP_CHUNK * HEAP_CHUNK).min(HEAP_BYTES);
    if heap < MIN_HEAP_CHUNKS * HEAP_CHUNK {
        0
    } else {
        heap
    }
}

/// Whether a server's announced heap size is one this side maps (0: no heap).
pub(crate) fn sane_heap(heap: usize) -> bool {
    heap.is_multiple_of(HEAP_CHUNK) && heap <= MAX_HEAP_BYTES
}

/// The chunks an item of `len` bytes at heap offset `start` spans.
fn span(start: usize, len: usize) -> (usize, usize) {
    let first = start / HEAP_CHUNK;
    (first, (start % HEAP_CHUNK + len).div_ceil(HEAP_CHUNK))
}

/// Either side's view of the heap.
struct Heap {
    map: ChunkMap,
    data: *mut u8,
    len: usize,
    /// Keeps the mapping alive while anything points into it.
    _region: Arc<Region>,
}

// SAFETY: the chunk map is atomics; the data bytes follow the heap's discipline (the producer
// writes only chunks it allocated, the consumer reads only chunks of items sent to it).
unsafe impl Send for Heap {}
// SAFETY: as above.
unsafe impl Sync for Heap {}

impl Heap {
    /// The heap of `len` bytes whose header is at `offset` of `region`; panics if it does not
    /// fit (the link lays the region out).
    fn new(region: Arc<Region>, offset: usize, len: usize) -> Heap {
        assert!(sane_heap(len) && len > 0);
        assert!(offset.is_multiple_of(HEAP_HEADER) && offset + heap_region_len(len) <= region.len());
        // SAFETY: in bounds (checked above); the region is page aligned and `offset` a multiple
        // of a page, so the words are aligned; the mapping lives as long as `_region`.
        let (map, data) = unsafe {
            let header = region.base().add(offset);
            (
                ChunkMap::from_raw(header.cast::<AtomicU64>(), len / HEAP_CHUNK),
                header.add(HEAP_HEADER),
            )
        };
        Heap {
            map,
            data,
            len,
            _region: region,
        }
    }

    /// Frees the chunks of the item of `len` bytes at heap offset `start`.
    fn free(&self, start: usize, len: usize) {
        let (first, chunks) = span(start, len);
        self.map.free(first, chunks);
    }
}

/// An item placed and not yet freed by the consumer: its chunks and whom it was placed for.
struct Placed {
    first: usize,
    chunks: usize,
    owner: u64,
}

/// The producer's side: places items.
pub(crate) struct HeapWriter {
    heap: Heap,
    /// Items placed and, as far as this side has looked, not freed (see the module docs).
    ledger: Mutex<Vec<Placed>>,
}

impl HeapWriter {
    pub(crate) fn new(region: Arc<Region>, offset: usize, len: usize) -> HeapWriter {
        HeapWriter {
            heap: Heap::new(region, offset, len),
            ledger: Mutex::new(Vec::new()),
        }
    }

    /// Copies an item of `len` bytes, the concatenation of `parts`, into free chunks for
    /// `owner` (the channel it goes to) and returns its heap offset; `None` when no run of
    /// free chunks is long enough, or when `shared` (the link serves other channels too) and
    /// `owner` would hold more than half the heap.
    pub(crate) fn place<'a>(
        &self,
        owner: u64,
        shared: bool,
        len: usize,
        parts: impl Iterator<Item = &'a [u8]>,
    ) -> Option<u64> {
        self.place_with(owner, shared, len, |mut dst| {
            for p in parts {
                assert!(p.len() <= dst.len(), "parts longer than the item");
                let (head, tail) = dst.split_at_mut(p.len());
                head.copy_from_slice(p);
                dst = tail;
            }
            assert!(dst.is_empty(), "parts shorter than the item");
        })
    }

    /// Like [`HeapWriter::place`], but `fill` writes the item's `len` bytes itself, straight
    /// into the chunks (every byte of the slice it gets).
    pub(crate) fn place_with(
        &self,
        owner: u64,
        shared: bool,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> Option<u64> {
        let (_, chunks) = span(ITEM_PAD, len);
        let first = {
            let mut items = self.ledger.lock().unwrap();
            // The consumer frees an item's chunks together, and only this side sets bits
            // again (below, after this pruning): an item whose first chunk is free is gone.
            items.retain(|p| !self.heap.map.is_free(p.first));
            if shared {
                let held: usize = items.iter().filter(|p| p.owner == owner).map(|p| p.chunks).sum();
                if held > 0 && held + chunks > self.heap.map.chunks() / 2 {
                    return None;
                }
            }
            let first = self.heap.map.alloc(chunks)?;
            items.push(Placed { first, chunks, owner });
            first
        };
        let start = first * HEAP_CHUNK + ITEM_PAD;
        // SAFETY: `start..start + len` lies within the chunks just allocated (they span
        // `ITEM_PAD + len` bytes from the first one's start), which nobody else reads or
        // writes until the consumer frees them after the frames naming them.
        let dst = unsafe { std::slice::from_raw_parts_mut(self.heap.data.add(start), len) };
        fill(dst);
        Some(start as u64)
    }

    /// Frees the item of `len` bytes placed at `start` whose frame was never sent (the
    /// consumer does not know it).
    pub(crate) fn take_back(&self, start: u64, len: usize) {
        let first = start as usize / HEAP_CHUNK;
        self.ledger.lock().unwrap().retain(|p| p.first != first);
        self.heap.free(start as usize, len);
    }

    /// Chunks in use (placed and not yet freed by the consumer).
    #[cfg(test)]
    pub(crate) fn chunks_in_use(&self) -> usize {
        self.heap.map.in_use()
    }
}

/// What a lease does before it frees its item's chunks.
type Release = Box<dyn FnOnce() + Send + Sync>;

/// The consumer's side: turns the places frames name into bytes and leases.
#[derive(Clone)]
pub(crate) struct HeapReader {
    heap: Arc<Heap>,
}

impl HeapReader {
    pub(crate) fn new(region: Arc<Region>, offset: usize, len: usize) -> HeapReader {
        HeapReader {
            heap: Arc::new(Heap::new(region, offset, len)),
        }
    }

    /// The lease on the item of `len` bytes at heap offset `start`, as a frame names it;
    /// an error message when the frame names a place the producer cannot have allocated.
    pub(crate) fn lease(&self, start: u64, len: u64) -> Result<HeapLease, String> {
        let (Ok(start), Ok(len)) = (usize::try_from(start), usize::try_from(len)) else {
            return Err(format!("heap item {start}+{len} out of range"));
        };
        if len == 0
            || start % HEAP_CHUNK != ITEM_PAD
            || start.checked_add(len).is_none_or(|e| e > self.heap.len)
        {
            return Err(format!(
                "heap item of {len} bytes at {start} is not one a producer places in a heap of {} bytes",
                self.heap.len
            ));
        }
        Ok(HeapLease {
            heap: self.heap.clone(),
            start,
            len,
            given_away: std::sync::atomic::AtomicBool::new(false),
            release: None,
        })
    }

    /// Frees the chunks of the item of `len` bytes at `start` that no lease of this process
    /// holds: one another process was given ([`HeapLease::give_away`]) and will never free
    /// (it let the item go unread, or is gone).
    pub(crate) fn free(&self, start: u64, len: u64) {
        self.heap.free(start as usize, len as usize);
    }
}

/// One item's chunks, held by the consumer: by the reader until the item's last frame is read,
/// and by every batch decoded in place from it. Freed when the last holder drops it.
pub(crate) struct HeapLease {
    heap: Arc<Heap>,
    start: usize,
    len: usize,
    /// Another process maps the heap and frees the item's chunks itself (see
    /// [`HeapLease::give_away`]).
    given_away: std::sync::atomic::AtomicBool,
    /// Run by the last holder before the chunks are freed (see [`HeapLease::on_release`]).
    release: Option<Release>,
}

impl HeapLease {
    /// The item's heap offset.
    pub(crate) fn start(&self) -> u64 {
        self.start as u64
    }

    /// Its length.
    pub(crate) fn len(&self) -> u64 {
        self.len as u64
    }

    /// The heap the item lies in.
    pub(crate) fn reader(&self) -> HeapReader {
        HeapReader {
            heap: self.heap.clone(),
        }
    }

    /// Runs `release` when the last holder lets the item go, just before its chunks are
    /// freed (so that a process that dies between the two leaves the chunks taken, never
    /// freed twice).
    pub(crate) fn on_release(mut self, release: impl FnOnce() + Send + Sync + 'static) -> HeapLease {
        self.release = Some(Box::new(release));
        self
    }

    /// Bytes `offset..offset + len` of the item (`None` past its end).
    pub(crate) fn bytes(&self, offset: usize, len: usize) -> Option<&[u8]> {
        if offset.checked_add(len)? > self.len {
            return None;
        }
        // SAFETY: within the item (checked), which lies within the heap (checked when leased);
        // the producer wrote it before sending the frame that named it and does not write it
        // again before this lease frees it.
        Some(unsafe { std::slice::from_raw_parts(self.heap.data.add(self.start + offset), len) })
    }

    /// Bytes `offset..offset + len` of the item as an Arrow buffer that holds the lease
    /// (`None` past the item's end or for an empty range).
    pub(crate) fn buffer(self: &Arc<Self>, offset: usize, len: usize) -> Option<Buffer> {
        let bytes = self.bytes(offset, len)?;
        let ptr = NonNull::new(bytes.as_ptr().cast_mut())?;
        if len == 0 {
            return None;
        }
        // SAFETY: `len` bytes at `ptr` stay valid and unchanged while the lease lives (see
        // `bytes`), and the buffer holds the lease.
        Some(unsafe { Buffer::from_custom_allocation(ptr, len, self.clone()) })
    }
}

impl HeapLease {
    /// Hands the item to another process that maps the same heap and frees its chunks when
    /// done with it: this lease's last holder then leaves them allocated. After this, this
    /// process must not read the item's bytes again (the other side may have freed them and
    /// the producer written the chunks anew).
    pub(crate) fn give_away(&self) {
        self.given_away.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for HeapLease {
    fn drop(&mut self) {
        if let Some(release) = self.release.take() {
            release();
        }
        if !self.given_away.load(std::sync::atomic::Ordering::SeqCst) {
            self.heap.free(self.start, self.len);
        }
    }
}

impl std::panic::RefUnwindSafe for HeapLease {}

#[cfg(test)]
mod tests {
    use super::*;

    fn heap(len: usize) -> (HeapWriter, HeapReader) {
        let (region, _fd) = Region::create(heap_region_len(len)).unwrap();
        let region = Arc::new(region);
        (
            HeapWriter::new(region.clone(), 0, len),
            HeapReader::new(region, 0, len),
        )
    }

    #[test]
    fn an_item_is_read_where_it_was_placed_and_freed_by_its_last_holder() {
        let (w, r) = heap(4 * HEAP_CHUNK);
        let item: Vec<u8> = (0..HEAP_CHUNK + 100).map(|i| (i * 7) as u8).collect();
        let (a, b) = item.split_at(1000);
        let start = w.place(0, false, item.len(), [a, b].into_iter()).unwrap();
        assert_eq!(start as usize, ITEM_PAD);
        assert_eq!(w.chunks_in_use(), 2);
        let lease = Arc::new(r.lease(start, item.len() as u64).unwrap());
        assert_eq!(lease.bytes(0, item.len()).unwrap(), &item[..]);
        let batch = lease.buffer(RECORD_HEADER_LEN, 5000).unwrap();
        assert_eq!(batch.as_ptr() as usize % 64, 0, "the record is 64-byte aligned");
        assert_eq!(
            batch.as_slice(),
            &item[RECORD_HEADER_LEN..RECORD_HEADER_LEN + 5000]
        );
        assert!(lease.bytes(1, item.len()).is_none());
        assert!(lease.buffer(item.len() - 10, 11).is_none());
        drop(lease);
        // The buffer still holds the chunks: the next item goes after them.
        assert_eq!(w.chunks_in_use(), 2);
        let next = w.place(1, false, 10, [&[1u8; 10][..]].into_iter()).unwrap();
        assert_eq!(next as usize, 2 * HEAP_CHUNK + ITEM_PAD);
        drop(batch);
        assert_eq!(w.chunks_in_use(), 1);
        drop(r.lease(next, 10).unwrap());
        assert_eq!(w.chunks_in_use(), 0);
    }

    #[test]
    fn a_channel_sharing_the_link_holds_at_most_half_the_heap() {
        let (w, r) = heap(8 * HEAP_CHUNK);
        let item = |chunks: usize| vec![7u8; chunks * HEAP_CHUNK - ITEM_PAD];
        let (one, two, five) = (item(1), item(2), item(5));
        let place = |owner: u64, shared: bool, bytes: &[u8]| {
            let start = w.place(owner, shared, bytes.len(), [bytes].into_iter())?;
            Some((start, bytes.len()))
        };
        // A link's only channel may take more than half; holding nothing, so may any channel.
        let alone = place(1, false, &five).unwrap();
        assert!(
            place(1, true, &one).is_none(),
            "past half the heap while sharing the link"
        );
        let mut held = vec![place(2, true, &two).unwrap()];
        assert!(place(2, true, &two).is_none(), "no run of two free chunks left");
        // Freed by the consumer, channel 1's items no longer count.
        drop(r.lease(alone.0, alone.1 as u64).unwrap());
        held.push(place(1, true, &two).unwrap());
        held.push(place(1, true, &two).unwrap());
        assert!(
            place(1, true, &one).is_none(),
            "channel 1 holds four of eight chunks"
        );
        held.push(place(2, true, &one).unwrap());
        assert_eq!(w.chunks_in_use(), 7);
        for (start, len) in held {
            drop(r.lease(start, len as u64).unwrap());
        }
        assert_eq!(w.chunks_in_use(), 0);
    }

    #[test]
    fn a_links_heap_is_a_quarter_of_memory_within_bounds() {
        assert_eq!(heap_bytes_for(64 << 20), 16 << 20);
        assert_eq!(heap_bytes_for(16 << 20), 4 << 20);
        assert_eq!(heap_bytes_for(1 << 30), HEAP_BYTES);
        assert_eq!(heap_bytes_for(1 << 20), 4 * HEAP_CHUNK);
        assert_eq!(heap_bytes_for(512 << 10), 0, "under four chunks: no heap");
        assert!(sane_heap(0) && sane_heap(HEAP_BYTES) && !sane_heap(HEAP_CHUNK + 1));
    }

    #[test]
    fn a_full_heap_refuses_and_bad_places_are_refused() {
        let (w, r) = heap(2 * HEAP_CHUNK);
        assert!(
            w.place(0, false, 2 * HEAP_CHUNK, std::iter::empty()).is_none(),
            "the pad does not fit"
        );
        let big = vec![3u8; 2 * HEAP_CHUNK - ITEM_PAD];
        let start = w.place(0, false, big.len(), [&big[..]].into_iter()).unwrap();
        assert!(w.place(0, false, 1, [&[1u8][..]].into_iter()).is_none());
        for (s, l) in [
            (0, 10),
            (ITEM_PAD as u64, 0),
            (ITEM_PAD as u64, 2 * HEAP_CHUNK as u64),
            (u64::MAX, 1),
        ] {
            assert!(r.lease(s, l).is_err(), "{s}+{l}");
        }
        drop(r.lease(start, big.len() as u64).unwrap());
        assert!(w.place(0, false, 1, [&[1u8][..]].into_iter()).is_some());
    }
}
