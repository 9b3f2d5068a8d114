//! [`Retired`]: handed-off batches a network sender is done with, left for the partition's
//! writer to drop.
//!
//! A batch handed over shares the writer's Arrow buffers, and whoever drops it last frees them:
//! for a batch imported from Python, pyarrow releases its export (its bookkeeping, allocated
//! on the writer's thread). Dropped by the sender, that cost falls on the I/O thread (the
//! busiest of a transfer) and the writer's memory is freed on another thread, which glibc
//! keeps apart until the writer next asks for a larger block and it must consolidate them.
//! So the sender leaves the batch here once its last byte is written, and the writer drops
//! what is here when it next writes or ends (the environment's flusher drops what has waited
//! a whole flusher period: the writer stays idle). A few batches wait at most ([`MAX_BATCHES`], [`MAX_BYTES`]):
//! past that, or once the writer has ended, the sender drops them itself, as it did before.

use std::sync::Mutex;

use super::handed::Handed;

/// The most batches that wait for the writer.
pub const MAX_BATCHES: usize = 8;
/// The most Arrow bytes that wait for the writer.
pub const MAX_BYTES: usize = 16 << 20;

/// Batches sent, waiting to be dropped by the writer.
pub struct Retired {
    held: Mutex<Held>,
}

struct Held {
    /// Each with the bytes it counts as.
    batches: Vec<(Handed, usize)>,
    bytes: usize,
    /// The first this many batches were here at the flusher's last pass.
    stale: usize,
    /// The writer may still come back for them.
    open: bool,
}

impl Default for Retired {
    fn default() -> Retired {
        Retired {
            held: Mutex::new(Held {
                batches: Vec::new(),
                bytes: 0,
                stale: 0,
                open: true,
            }),
        }
    }
}

impl Retired {
    /// Keeps `batch` (`bytes` of Arrow memory) for the writer to drop, or gives it back (for
    /// the caller to drop) when the writer has ended or enough waits already.
    pub fn keep(&self, batch: Handed, bytes: usize) -> Option<Handed> {
        let mut held = self.held.lock().unwrap();
        if !held.open || held.batches.len() >= MAX_BATCHES || held.bytes + bytes > MAX_BYTES {
            return Some(batch);
        }
        held.batches.push((batch, bytes));
        held.bytes += bytes;
        None
    }

    /// Drops the batches kept, on the calling (the writer's) thread.
    pub fn drop_kept(&self) {
        let kept = {
            let mut held = self.held.lock().unwrap();
            if held.batches.is_empty() {
                return;
            }
            held.bytes = 0;
            held.stale = 0;
            std::mem::take(&mut held.batches)
        };
        drop(kept);
    }

    /// The flusher's pass: drops the batches that were here at its last pass already (their
    /// writer has not written since), on the calling thread.
    pub fn drop_stale(&self) {
        let stale: Vec<(Handed, usize)> = {
            let mut held = self.held.lock().unwrap();
            let n = held.stale;
            let stale: Vec<(Handed, usize)> = held.batches.drain(..n).collect();
            held.bytes -= stale.iter().map(|(_, b)| b).sum::<usize>();
            held.stale = held.batches.len();
            stale
        };
        drop(stale);
    }

    /// The writer has ended: drops what is kept; the batches sent after are dropped by their
    /// sender.
    pub fn close(&self) {
        self.held.lock().unwrap().open = false;
        self.drop_kept();
    }

    /// How many batches wait.
    pub fn len(&self) -> usize {
        self.held.lock().unwrap().batches.len()
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Int64Array, RecordBatch};

    use super::*;

    fn batch(rows: usize) -> Handed {
        let k = Int64Array::from_iter_values(0..rows as i64);
        Handed::Batch(RecordBatch::try_from_iter([("k", Arc::new(k) as _)]).unwrap())
    }

    #[test]
    fn kept_batches_are_dropped_by_the_writer_up_to_the_limits() {
        let r = Retired::default();
        for _ in 0..MAX_BATCHES {
            assert!(r.keep(batch(1), 8).is_none());
        }
        assert!(r.keep(batch(1), 8).is_some(), "one past the count");
        r.drop_kept();
        assert!(r.is_empty());
        assert!(r.keep(batch(1), MAX_BYTES - 8).is_none());
        assert!(r.keep(batch(1), 16).is_some(), "one past the bytes");
        assert!(r.keep(batch(1), 8).is_none(), "exactly at the bytes");
        assert_eq!(r.len(), 2);
        r.drop_kept();
        assert!(
            r.keep(batch(1), MAX_BYTES).is_none(),
            "the byte count starts again"
        );
    }

    #[test]
    fn the_flusher_drops_only_what_waited_since_its_last_pass() {
        let r = Retired::default();
        assert!(r.keep(batch(1), 8).is_none());
        r.drop_stale();
        assert_eq!(r.len(), 1, "kept after the pass before: not stale yet");
        assert!(r.keep(batch(1), 8).is_none());
        r.drop_stale();
        assert_eq!(r.len(), 1, "the first dropped, the second kept");
        r.drop_kept();
        assert!(r.keep(batch(1), 8).is_none());
        r.drop_stale();
        assert_eq!(r.len(), 1, "the writer's drop forgets which were stale");
        r.drop_stale();
        assert!(r.is_empty());
        for _ in 0..MAX_BATCHES {
            assert!(
                r.keep(batch(1), 8).is_none(),
                "the counts went down with the pass"
            );
        }
    }

    #[test]
    fn after_the_writer_ends_every_batch_goes_back_to_its_sender() {
        let r = Retired::default();
        assert!(r.keep(batch(1), 8).is_none());
        r.close();
        assert!(r.is_empty(), "closing drops what was kept");
        assert!(r.keep(batch(1), 8).is_some());
        assert!(r.is_empty());
    }
}
