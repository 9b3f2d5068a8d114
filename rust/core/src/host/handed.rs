//! The pieces the service hands a gate's task as they lie in writer links' heaps, and who
//! frees them. The task frees a piece's chunks itself when it lets the piece go (the frame
//! read and every batch on it dropped); what it never frees would stay taken until the
//! writer's link ends, its writer then copying through the ring what no longer fits. So each
//! piece handed over has a slot in a table in the gate link's region, whose state both sides
//! change, and the service frees what the task can no longer free:
//!
//! - `GIVEN` (the service set it, with the forward frame): once the task's end of the link is
//!   gone the frame will never be read, so the service frees the piece;
//! - `TAKEN` (the task read the frame and holds the piece): once the task's process is gone,
//!   the service frees it;
//! - `FREE`: the task let the piece go. It marks the slot free *before* it frees the chunks,
//!   so a task that dies between the two leaves them taken, never freed twice (a chunk freed
//!   twice could be one the writer has placed anew).
//!
//! A piece with no free slot is copied instead, as one that does not fit a writer's heap.

use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::codec::Forwarded;
use super::process::Process;
use super::state::SentCounters;
use crate::net::shm::{HeapLease, HeapReader, Region};

/// Slots of a gate link's table: pieces handed over and not yet freed, at most.
pub(crate) const SLOTS: usize = 4096;
/// Bytes of the table.
pub(crate) const TABLE_BYTES: usize = SLOTS * 8;
/// How often an unsettled table is looked at once its gate has ended.
const SETTLE_PERIOD: Duration = Duration::from_millis(250);

/// Fewest pieces remembered before those the task freed are forgotten.
const MIN_PRUNE: usize = 64;

const FREE: u64 = 0;
const GIVEN: u64 = 1;
const TAKEN: u64 = 2;

/// The table of a gate link's region, as either side maps it.
pub(crate) struct Table {
    words: NonNull<AtomicU64>,
    /// Keeps the mapping alive while the table is used.
    _region: Arc<Region>,
}

// SAFETY: the table is atomics in a shared mapping that `_region` keeps alive.
unsafe impl Send for Table {}
// SAFETY: as above.
unsafe impl Sync for Table {}

impl Table {
    /// The table at `offset` of `region`; panics if it does not fit (the link lays the region
    /// out).
    pub(crate) fn new(region: Arc<Region>, offset: usize) -> Table {
        assert!(offset.is_multiple_of(8) && offset + TABLE_BYTES <= region.len());
        // SAFETY: in bounds and aligned (checked above; the region is page aligned); a fresh
        // region is zeroed, every slot `FREE`.
        let words = unsafe { NonNull::new_unchecked(region.base().add(offset).cast::<AtomicU64>()) };
        Table {
            words,
            _region: region,
        }
    }

    fn slot(&self, slot: usize) -> &AtomicU64 {
        assert!(slot < SLOTS);
        // SAFETY: within the table (checked), which the mapping holds while `self` lives.
        unsafe { self.words.as_ptr().add(slot).as_ref().expect("a mapped table") }
    }

    /// Task side: takes the piece of a forward frame, leased as `lease`, from its slot (`GIVEN`
    /// to `TAKEN`); the lease then marks the slot free when the piece is let go, before the
    /// chunks are freed. An error unless the service gave the slot: the piece is then not this
    /// side's to free, and the lease leaves its chunks alone.
    pub(crate) fn take(self: &Arc<Self>, slot: u32, lease: HeapLease) -> Result<HeapLease, String> {
        let at = slot as usize;
        let taken = if at < SLOTS {
            self.slot(at)
                .compare_exchange(GIVEN, TAKEN, Ordering::AcqRel, Ordering::Acquire)
                .map_err(|state| format!("a forwarded piece in slot {slot}, which is in state {state}"))
        } else {
            Err(format!("a forwarded piece in slot {slot} of {SLOTS}"))
        };
        if let Err(e) = taken {
            lease.give_away();
            return Err(e);
        }
        let table = self.clone();
        Ok(lease.on_release(move || table.slot(at).store(FREE, Ordering::Release)))
    }
}

/// A piece the service handed over: where it lies, to free it if the task cannot.
struct Piece {
    heap: HeapReader,
    start: u64,
    len: u64,
}

/// Service side: the pieces handed to one gate's task, by slot.
pub(crate) struct Handed {
    table: Table,
    pieces: HashMap<u32, Piece>,
    /// Where the search for a free slot starts: slots free up roughly in the order given.
    next: usize,
    /// Pieces remembered at which those the task freed are forgotten (twice what was left
    /// the last time, so the work stays in proportion to the pieces handed over).
    prune_at: usize,
}

impl Handed {
    pub(crate) fn new(table: Table) -> Handed {
        Handed {
            table,
            pieces: HashMap::new(),
            next: 0,
            prune_at: MIN_PRUNE,
        }
    }

    /// Gives `lease`'s piece of writer link `source` a slot, to be named in its forward frame,
    /// and the lease away: from here the task frees the chunks (or this side, once the task
    /// cannot), and this side reads no more of the piece. `None` when every slot is taken (the
    /// piece is then copied, the lease kept).
    pub(crate) fn hand(&mut self, source: u64, lease: &HeapLease) -> Option<Forwarded> {
        let slot = (0..SLOTS)
            .map(|i| (self.next + i) % SLOTS)
            .find(|&i| self.table.slot(i).load(Ordering::Acquire) == FREE)?;
        self.next = (slot + 1) % SLOTS;
        self.table.slot(slot).store(GIVEN, Ordering::Release);
        let (start, len) = (lease.start(), lease.len());
        let heap = lease.reader();
        // A piece this map still holds for the slot was freed by the task: forgotten here.
        self.pieces.insert(slot as u32, Piece { heap, start, len });
        lease.give_away();
        if self.pieces.len() >= self.prune_at {
            let left = self.outstanding();
            self.prune_at = (2 * left).max(MIN_PRUNE);
        }
        Some(Forwarded {
            source,
            slot: slot as u32,
            start,
            len,
        })
    }

    /// Frees what the task can no longer free: pieces it was never to read once `link_gone`,
    /// every piece once `task_gone`. Forgets the pieces the task freed. The pieces still
    /// handed out, and how many this call freed.
    fn reclaim(&mut self, link_gone: bool, task_gone: bool) -> (usize, usize) {
        let table = &self.table;
        let mut freed = 0;
        self.pieces.retain(|&slot, piece| {
            let word = table.slot(slot as usize);
            let state = word.load(Ordering::Acquire);
            let ours = match state {
                FREE => return false,
                GIVEN if link_gone => word
                    .compare_exchange(GIVEN, FREE, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok(),
                TAKEN if task_gone => {
                    word.store(FREE, Ordering::Release);
                    true
                }
                _ => false,
            };
            if ours {
                piece.heap.free(piece.start, piece.len);
                freed += 1;
            }
            !ours
        });
        (self.pieces.len(), freed)
    }

    /// After the gate ended: waits until every piece handed over is freed, by the task or by
    /// this side (see [`Handed::reclaim`]). `link_gone`: the task's end of the link is gone;
    /// `session_gone`: its session ended (when the process may be gone: only then is it
    /// looked for); `stopping`: the service ends. Counts the pieces this side freed in
    /// `sent`.
    pub(crate) async fn settle(
        mut self,
        task: Process,
        [link_gone, session_gone, stopping]: [Arc<AtomicBool>; 3],
        sent: Arc<SentCounters>,
    ) {
        loop {
            let task_gone = session_gone.load(Ordering::SeqCst) && !task.alive();
            // A task that is gone reads nothing more, whether or not its link's end was seen.
            let link_gone = task_gone || link_gone.load(Ordering::SeqCst);
            let (left, freed) = self.reclaim(link_gone, task_gone);
            sent.reclaimed.fetch_add(freed as u64, Ordering::Relaxed);
            if left == 0 || stopping.load(Ordering::SeqCst) {
                return;
            }
            tokio::time::sleep(SETTLE_PERIOD).await;
        }
    }

    /// Pieces handed over and not (as far as this side has looked) freed.
    pub(crate) fn outstanding(&mut self) -> usize {
        self.reclaim(false, false).0
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::net::shm::{heap_region_len, HeapWriter, HEAP_CHUNK, ITEM_PAD};

    const CHUNKS: usize = 32;

    /// A writer link's heap (both sides) and a gate link's table, as the service and the task
    /// see it.
    fn setup() -> (HeapWriter, HeapReader, Handed, Arc<Table>) {
        let (heap, _fd) = Region::create(heap_region_len(CHUNKS * HEAP_CHUNK)).unwrap();
        let heap = Arc::new(heap);
        let writer = HeapWriter::new(heap.clone(), 0, CHUNKS * HEAP_CHUNK);
        let reader = HeapReader::new(heap, 0, CHUNKS * HEAP_CHUNK);
        let (table, _fd) = Region::create(TABLE_BYTES).unwrap();
        let table = Arc::new(table);
        let service = Handed::new(Table::new(table.clone(), 0));
        (writer, reader, service, Arc::new(Table::new(table, 0)))
    }

    /// Places an item of `chunks` chunks; the service's lease on it, as a writer link's reader
    /// holds it.
    fn place(writer: &HeapWriter, reader: &HeapReader, chunks: usize) -> Option<HeapLease> {
        let len = chunks * HEAP_CHUNK - ITEM_PAD;
        let start = writer.place_with(0, false, len, |b| b.fill(7))?;
        Some(reader.lease(start, len as u64).unwrap())
    }

    #[test]
    fn a_slot_is_taken_once_and_freed_before_its_chunks() {
        let (writer, reader, mut service, task) = setup();
        let lease = place(&writer, &reader, 2).unwrap();
        let f = service.hand(7, &lease).unwrap();
        drop(lease);
        assert_eq!((f.source, f.len), (7, (2 * HEAP_CHUNK - ITEM_PAD) as u64));
        let taken = task.take(f.slot, reader.lease(f.start, f.len).unwrap()).unwrap();
        // A slot is taken once, and only one the service gave.
        let again = task.take(f.slot, reader.lease(f.start, f.len).unwrap());
        assert!(again.err().unwrap().contains("state 2"));
        assert!(task
            .take(f.slot + 1, reader.lease(f.start, f.len).unwrap())
            .is_err());
        assert!(task
            .take(SLOTS as u32, reader.lease(f.start, f.len).unwrap())
            .is_err());
        // A piece refused is not the task's to free.
        assert_eq!(writer.chunks_in_use(), 2);
        // Held by a live task whose link is gone: not the service's to free.
        assert_eq!(service.reclaim(true, false), (1, 0));
        drop(taken);
        assert_eq!(service.reclaim(true, true), (0, 0));
        assert_eq!(writer.chunks_in_use(), 0);
    }

    #[test]
    fn with_every_slot_handed_out_a_piece_is_copied_until_one_is_freed() {
        let (writer, reader, mut service, task) = setup();
        let lease = place(&writer, &reader, 1).unwrap();
        let slots: Vec<u32> = (0..SLOTS)
            .map(|_| service.hand(1, &lease).unwrap().slot)
            .collect();
        assert_eq!(
            slots.iter().collect::<std::collections::HashSet<_>>().len(),
            SLOTS
        );
        assert!(service.hand(1, &lease).is_none());
        let taken = task
            .take(slots[100], reader.lease(lease.start(), lease.len()).unwrap())
            .unwrap();
        taken.give_away(); // the same item stands for every slot here: freed once, below
        drop(taken);
        assert_eq!(service.hand(1, &lease).map(|f| f.slot), Some(slots[100]));
    }

    /// What the task does in the model.
    #[derive(Debug, Clone)]
    enum Step {
        /// The writer places an item of 1 to 3 chunks, which the service hands over.
        Place(usize),
        /// The task reads the oldest frame on its link.
        Read,
        /// The task lets go of a held piece (an index into what it holds).
        Drop(usize),
        /// The task lets its gate go: frames on the link stay unread.
        LetGo,
        /// The task's process dies, holding what it holds.
        Die,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            6 => (1usize..4).prop_map(Step::Place),
            5 => Just(Step::Read),
            4 => (0usize..8).prop_map(Step::Drop),
            1 => Just(Step::LetGo),
            1 => Just(Step::Die),
        ]
    }

    proptest! {
        /// Whatever the task reads, holds, lets go or leaves behind, the chunks in use are
        /// exactly the pieces still on the link or held; once the link is gone the unread ones
        /// are freed, once the task is gone every one: none freed twice, none lost.
        #[test]
        fn chunks_in_use_are_what_is_unread_or_held_and_none_is_freed_twice(steps in prop::collection::vec(step(), 1..80)) {
            let (writer, reader, mut service, task) = setup();
            let mut link: std::collections::VecDeque<(Forwarded, usize)> = Default::default();
            let mut held: Vec<(HeapLease, usize)> = Vec::new();
            let (mut link_gone, mut task_gone) = (false, false);
            for s in steps {
                match s {
                    Step::Place(chunks) if !task_gone => {
                        if let Some(lease) = place(&writer, &reader, chunks) {
                            let f = service.hand(1, &lease).unwrap();
                            if link_gone {
                                // The service writes no more frames on a link that ended.
                                service.reclaim(true, false);
                            } else {
                                link.push_back((f, chunks));
                            }
                        }
                    }
                    Step::Read if !link_gone => {
                        if let Some((f, chunks)) = link.pop_front() {
                            let lease = task.take(f.slot, reader.lease(f.start, f.len).unwrap()).unwrap();
                            held.push((lease, chunks));
                        }
                    }
                    Step::Drop(i) if !task_gone && !held.is_empty() => {
                        drop(held.remove(i % held.len()));
                    }
                    Step::LetGo => {
                        link_gone = true;
                        link.clear();
                    }
                    Step::Die => {
                        (link_gone, task_gone) = (true, true);
                        link.clear();
                        // A dead process runs no destructor.
                        for (lease, _) in held.drain(..) {
                            std::mem::forget(lease);
                        }
                    }
                    _ => {}
                }
                service.reclaim(link_gone, task_gone);
                let expected: usize = link.iter().map(|(_, c)| c).chain(held.iter().map(|(_, c)| c)).sum();
                prop_assert_eq!(writer.chunks_in_use(), expected);
            }
        }
    }
}
