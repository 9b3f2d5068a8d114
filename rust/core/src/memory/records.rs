//! [`RecordPool`]: the 64-byte aligned blocks that received records are gathered into, used
//! again once the last Arrow buffer over one is dropped.
//!
//! A record of a few MB in a fresh allocation costs a page fault per 4 KiB page the first
//! time it is written (the allocator maps large blocks fresh and unmaps them when freed), and
//! the receive path writes every byte of it. A block given back by a dropped batch is still
//! mapped, so a stream of similar records settles on blocks that move round between the
//! reader and the consumer without faults. A block goes back only when no buffer uses it any
//! more, so a batch a user holds never changes.
//!
//! A block's capacity is its first record's length rounded up by at most 12.5 %, so records of
//! similar sizes share blocks; a block is handed out again only for a record that needs at
//! least half of it. The pool keeps idle blocks only while they and the blocks out (records
//! being received, batches not yet dropped) stay within its `limit` (the gate's record
//! budget): idle blocks never take the memory of a gate's records past what its budget lets
//! them hold, and a consumer that keeps many batches leaves the pool nothing idle.

use std::alloc::Layout;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use arrow_buffer::Buffer;

/// Alignment of every block (Arrow's).
const ALIGN: usize = 64;
/// Idle blocks kept at most, whatever their size.
const MAX_IDLE_BLOCKS: usize = 32;

/// An owned, 64-byte aligned allocation.
struct Block {
    ptr: NonNull<u8>,
    cap: usize,
}

// SAFETY: a block is plain memory owned by whoever holds the `Block`; nothing else points at
// it except buffers that only read it after the last write (see `RecordBuf::freeze`).
unsafe impl Send for Block {}
// SAFETY: as above; `&Block` gives no access to the memory.
unsafe impl Sync for Block {}

impl Block {
    fn layout(cap: usize) -> Layout {
        Layout::from_size_align(cap.max(1), ALIGN).expect("a record's size is a valid layout")
    }

    fn new(cap: usize) -> Block {
        let layout = Block::layout(cap);
        // SAFETY: the layout's size is at least 1.
        let ptr = unsafe { std::alloc::alloc(layout) };
        let Some(ptr) = NonNull::new(ptr) else {
            std::alloc::handle_alloc_error(layout)
        };
        Block { ptr, cap }
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        // SAFETY: allocated in `Block::new` with this layout, and freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), Block::layout(self.cap)) }
    }
}

struct Idle {
    blocks: Vec<Block>,
    /// Bytes of `blocks`.
    bytes: usize,
    /// Bytes of the blocks handed out and not given back yet.
    out: usize,
}

impl Idle {
    /// Frees idle blocks, smallest first, while `out` and the idle ones together exceed
    /// `limit` less `room`, or there are more than `MAX_IDLE_BLOCKS - room_blocks`; they are
    /// moved to `freed` (to be dropped outside the lock). Stops at blocks not smaller than
    /// `keep_over` (0: frees any). Returns whether the bound holds now.
    fn shrink(
        &mut self,
        limit: usize,
        room: usize,
        room_blocks: usize,
        keep_over: usize,
        freed: &mut Vec<Block>,
    ) -> bool {
        loop {
            let fits =
                self.blocks.len() + room_blocks <= MAX_IDLE_BLOCKS && self.out + self.bytes + room <= limit;
            if fits {
                return true;
            }
            let smallest = (0..self.blocks.len()).min_by_key(|&i| self.blocks[i].cap);
            match smallest {
                Some(i) if keep_over == 0 || self.blocks[i].cap < keep_over => {
                    let b = self.blocks.remove(i);
                    self.bytes -= b.cap;
                    freed.push(b);
                }
                _ => return false,
            }
        }
    }
}

struct Inner {
    idle: Mutex<Idle>,
    /// Idle and handed-out blocks together stay within this while there are idle ones.
    limit: usize,
    /// Blocks allocated fresh.
    allocated: AtomicU64,
    /// Blocks handed out again.
    reused: AtomicU64,
}

impl Inner {
    /// A block handed out comes back: kept for a later record if it fits within the limit
    /// (freeing smaller idle blocks for it if need be: a larger block serves more records),
    /// else freed.
    fn give_back(&self, block: Block) {
        let mut freed = Vec::new();
        let mut idle = self.idle.lock().unwrap();
        idle.out -= block.cap;
        if idle.shrink(self.limit, block.cap, 1, block.cap, &mut freed) {
            idle.bytes += block.cap;
            idle.blocks.push(block);
        } else {
            freed.push(block);
        }
        drop(idle);
        // `freed` is freed here, outside the lock.
    }
}

/// The capacity a block for a record of `len` bytes gets: `len` rounded up to a sixteenth of
/// the power of two at or above it (at most 12.5 % more), so that records of similar sizes fit
/// each other's blocks.
fn block_capacity(len: usize) -> usize {
    if len <= ALIGN {
        return ALIGN;
    }
    let step = (len.next_power_of_two() / 16).max(ALIGN);
    len.div_ceil(step).saturating_mul(step)
}

/// How often a [`RecordPool`] allocated a block and how often it used one again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecordPoolStats {
    /// Blocks allocated fresh (each costs page faults as it is first written).
    pub allocated: u64,
    /// Blocks handed out again after a dropped record gave them back.
    pub reused: u64,
}

/// Blocks for received records, shared by the channels of one gate (cheap to clone).
#[derive(Clone)]
pub struct RecordPool {
    inner: Arc<Inner>,
}

impl RecordPool {
    /// A pool whose idle and handed-out blocks together stay within `limit` bytes while it
    /// keeps any idle (0: it keeps none, every record is a fresh allocation).
    pub fn new(limit: usize) -> RecordPool {
        RecordPool {
            inner: Arc::new(Inner {
                idle: Mutex::new(Idle {
                    blocks: Vec::new(),
                    bytes: 0,
                    out: 0,
                }),
                limit,
                allocated: AtomicU64::new(0),
                reused: AtomicU64::new(0),
            }),
        }
    }

    /// An empty record of capacity `len`: the smallest idle block that holds it and is at
    /// most twice its size, else a fresh one (idle blocks are freed to keep the limit).
    pub fn take(&self, len: usize) -> RecordBuf {
        let mut freed = Vec::new();
        let block = {
            let mut idle = self.inner.idle.lock().unwrap();
            // The smallest that fits; of equal ones the latest given back, whose lines are the
            // likeliest still to be in the cache.
            let best = (0..idle.blocks.len())
                .rev()
                .filter(|&i| idle.blocks[i].cap >= len && idle.blocks[i].cap / 2 <= len)
                .min_by_key(|&i| idle.blocks[i].cap);
            let block = match best {
                Some(i) => {
                    let block = idle.blocks.remove(i);
                    idle.bytes -= block.cap;
                    self.inner.reused.fetch_add(1, Ordering::Relaxed);
                    Some(block)
                }
                None => {
                    idle.shrink(self.inner.limit, block_capacity(len), 0, 0, &mut freed);
                    None
                }
            };
            idle.out += block.as_ref().map_or(block_capacity(len), |b| b.cap);
            block
        };
        drop(freed);
        let block = block.unwrap_or_else(|| {
            self.inner.allocated.fetch_add(1, Ordering::Relaxed);
            Block::new(block_capacity(len))
        });
        RecordBuf {
            block: Some(block),
            len: 0,
            want: len,
            pool: Arc::downgrade(&self.inner),
        }
    }

    /// Fresh and reused blocks so far.
    pub fn stats(&self) -> RecordPoolStats {
        RecordPoolStats {
            allocated: self.inner.allocated.load(Ordering::Relaxed),
            reused: self.inner.reused.load(Ordering::Relaxed),
        }
    }

    /// Bytes of idle blocks held now.
    pub fn idle_bytes(&self) -> usize {
        self.inner.idle.lock().unwrap().bytes
    }
}

/// A record being written: `want` bytes, of which the first `len` are written. Dropped
/// unfinished, its block goes back to the pool.
pub struct RecordBuf {
    block: Option<Block>,
    len: usize,
    want: usize,
    pool: Weak<Inner>,
}

impl RecordBuf {
    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True before anything is written.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes still to write.
    pub fn missing(&self) -> usize {
        self.want - self.len
    }

    /// The unwritten rest of the record (`missing()` bytes).
    pub fn spare(&mut self) -> &mut [MaybeUninit<u8>] {
        let block = self.block.as_ref().expect("a record being written has its block");
        // SAFETY: `len..want` lies inside the block (`want <= cap`); `&mut self` makes this the
        // only access, and `MaybeUninit` allows the bytes to be uninitialized.
        unsafe {
            std::slice::from_raw_parts_mut(
                block.ptr.as_ptr().add(self.len).cast::<MaybeUninit<u8>>(),
                self.want - self.len,
            )
        }
    }

    /// Marks the next `n` bytes of [`RecordBuf::spare`] as written.
    ///
    /// # Safety
    /// Those `n` bytes must have been initialized; `n <= missing()` (checked: panics).
    pub unsafe fn commit(&mut self, n: usize) {
        assert!(n <= self.missing(), "commit past the end of the record");
        self.len += n;
    }

    /// Copies `bytes` (at most `missing()`) in after what is written.
    pub fn extend_from_slice(&mut self, bytes: &[u8]) {
        let n = bytes.len();
        let spare = &mut self.spare()[..n];
        for (d, s) in spare.iter_mut().zip(bytes) {
            d.write(*s);
        }
        // SAFETY: the `n` bytes were just written.
        unsafe { self.commit(n) };
    }

    /// The written record as an Arrow buffer; its block goes back to the pool once the last
    /// buffer over it is dropped.
    pub fn freeze(mut self) -> Buffer {
        let block = self.block.take().expect("a record being written has its block");
        let ptr = block.ptr;
        let owner = Arc::new(Owner {
            block: Some(block),
            pool: std::mem::take(&mut self.pool),
        });
        // SAFETY: `ptr` points at `self.len` initialized bytes inside the block, which `owner`
        // keeps alive (and unwritten: nothing else holds it) until the last buffer is dropped.
        unsafe { Buffer::from_custom_allocation(ptr, self.len, owner) }
    }
}

impl Drop for RecordBuf {
    fn drop(&mut self) {
        if let (Some(block), Some(pool)) = (self.block.take(), self.pool.upgrade()) {
            pool.give_back(block);
        }
    }
}

/// Keeps a frozen record's block until its buffers are gone.
struct Owner {
    block: Option<Block>,
    pool: Weak<Inner>,
}

impl Drop for Owner {
    fn drop(&mut self) {
        if let (Some(block), Some(pool)) = (self.block.take(), self.pool.upgrade()) {
            pool.give_back(block);
        }
    }
}

impl std::panic::RefUnwindSafe for Owner {}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(pool: &RecordPool, bytes: &[u8]) -> Buffer {
        let mut r = pool.take(bytes.len());
        r.extend_from_slice(bytes);
        assert_eq!(r.missing(), 0);
        r.freeze()
    }

    #[test]
    fn a_dropped_record_gives_its_block_to_the_next() {
        let pool = RecordPool::new(1 << 20);
        let a = record(&pool, &[1u8; 1000]);
        let at = a.as_ptr();
        assert_eq!(at as usize % ALIGN, 0);
        drop(a);
        let b = record(&pool, &[2u8; 900]);
        assert_eq!(b.as_ptr(), at, "the idle block was used again");
        assert_eq!(b.as_slice(), &[2u8; 900][..]);
        assert_eq!(
            pool.stats(),
            RecordPoolStats {
                allocated: 1,
                reused: 1
            }
        );
    }

    #[test]
    fn of_equal_blocks_the_latest_given_back_is_used_first() {
        let pool = RecordPool::new(1 << 20);
        let (a, b) = (record(&pool, &[1u8; 4000]), record(&pool, &[2u8; 4000]));
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        drop(a);
        drop(b);
        assert_eq!(record(&pool, &[3u8; 4000]).as_ptr(), pb);
        drop(record(&pool, &[4u8; 4000])); // b's block again (given back last)
        let (c, d) = (record(&pool, &[5u8; 4000]), record(&pool, &[6u8; 4000]));
        assert_eq!((c.as_ptr(), d.as_ptr()), (pb, pa));
    }

    #[test]
    fn a_held_record_is_never_handed_out() {
        let pool = RecordPool::new(1 << 20);
        let held = record(&pool, &[7u8; 4096]);
        let slice = held.slice(100);
        drop(held);
        // The slice still holds the block: the next record gets another.
        let next = record(&pool, &[9u8; 4096]);
        assert_ne!(next.as_ptr(), slice.as_ptr().wrapping_sub(100));
        assert!(slice.as_slice().iter().all(|&b| b == 7));
        drop(slice);
        drop(next);
        assert_eq!(pool.stats().allocated, 2);
        assert_eq!(pool.idle_bytes(), 2 * 4096);
    }

    #[test]
    fn capacities_round_up_to_an_eighth_of_their_power_of_two() {
        assert_eq!(block_capacity(1), 64);
        assert_eq!(block_capacity(8000), 8192);
        assert_eq!(block_capacity(8193), 9216);
        assert_eq!(block_capacity(3_000_000), 3_145_728);
        for len in [65, 1000, 4097, 1 << 20, (1 << 20) + 1, 5_000_000] {
            let cap = block_capacity(len);
            assert!(cap >= len && cap - len <= len / 8 + 64, "{len} -> {cap}");
        }
    }

    #[test]
    fn blocks_too_large_or_small_are_not_used_and_idle_and_out_stay_within_the_limit() {
        let pool = RecordPool::new(10_000);
        let (a, b) = (record(&pool, &[0u8; 4000]), record(&pool, &[0u8; 4000])); // 4,096 each
        drop((a, b));
        assert_eq!(pool.idle_bytes(), 8192);
        // No idle block holds 9,000 bytes: a fresh one, and the idle ones go to make room.
        drop(record(&pool, &[0u8; 9000])); // 9,216
        assert_eq!(
            pool.stats(),
            RecordPoolStats {
                allocated: 3,
                reused: 0
            }
        );
        assert_eq!(pool.idle_bytes(), 9216);
        // Records between half and all of it use it; a record under half of it does not.
        for len in [5200, 9216, 9000] {
            drop(record(&pool, &vec![1u8; len]));
        }
        assert_eq!(
            pool.stats(),
            RecordPoolStats {
                allocated: 3,
                reused: 3
            }
        );
        drop(record(&pool, &[0u8; 3000]));
        assert_eq!(pool.stats().allocated, 4);
        // A block larger than the whole limit is never kept.
        drop(record(&pool, &[0u8; 20_000]));
        assert_eq!(pool.idle_bytes(), 0);
    }

    #[test]
    fn a_consumer_holding_batches_leaves_the_pool_nothing_idle() {
        let pool = RecordPool::new(10_000);
        let held = [record(&pool, &[0u8; 4000]), record(&pool, &[0u8; 4000])];
        drop(record(&pool, &[0u8; 4000]));
        // 8,192 out and 4,096 more idle would pass the limit: freed.
        assert_eq!(pool.idle_bytes(), 0);
        drop(held);
        assert_eq!(pool.idle_bytes(), 8192);
    }

    #[test]
    fn an_unfinished_record_gives_its_block_back_and_outlives_its_pool() {
        let pool = RecordPool::new(1 << 20);
        let mut r = pool.take(64);
        r.extend_from_slice(&[1; 10]);
        drop(r);
        assert_eq!(pool.idle_bytes(), 64);
        let kept = record(&pool, &[3u8; 64]);
        drop(pool);
        assert_eq!(kept.as_slice(), &[3u8; 64][..]);
        drop(kept); // freed, not given back: the pool is gone
    }
}
