//! Reading a stored stream: every reader of a spillable subpartition gets its own pipelined
//! [`Subpartition`] (a *view*) and a thread that walks the store's log with its own cursor
//! and feeds the view, so local gates and remote connections read it exactly as they read a
//! pipelined one (credit, backlog, buffer debloating included).
//!
//! The feeder queues each chunk: one in memory as it is (readers share the stored buffer),
//! one on disk read into a segment of the partition's pool. It keeps at most [`READ_AHEAD`] finished entries queued
//! and waits for the reader to take one before it reads on, so a remote reader's credit (which
//! decides how fast its view drains) also decides how far ahead the file is read. File reads
//! happen on this thread, never on the transport's event loop.

use std::sync::Arc;
use std::time::Duration;

use super::store::{Next, SpillStore, Stored};
use crate::base::error::{Error, Result};
use crate::base::event::Event;
use crate::base::wait::Wait;
use crate::memory::{LocalPool, PooledSegment};
use crate::partition::buffer::new_buffer_limited;
use crate::partition::subpartition::{Entry, Subpartition};

/// Finished entries a feeder keeps queued in its view ahead of the reader.
pub const READ_AHEAD: usize = 8;

/// How long a feeder sleeps before it looks again whether its view or the store went away.
const POLL: Duration = Duration::from_millis(100);

/// What a feeder needs from its partition (kept alive while it runs).
pub(crate) trait Source: Send + Sync + 'static {
    /// The store.
    fn store(&self) -> &SpillStore;
    /// The pool the view's buffers come from.
    fn pool(&self) -> &LocalPool;
    /// The partition's id (thread names, errors).
    fn id(&self) -> &str;
}

/// Starts the feeder of `view`, reading subpartition `sub` from the start.
pub(crate) fn spawn<S: Source>(source: Arc<S>, sub: usize, view: Arc<Subpartition>) -> Result<()> {
    let name = format!("creditflow-replay-{sub}");
    std::thread::Builder::new()
        .name(name)
        .spawn(move || {
            let me = std::thread::current();
            view.set_taken_listener(Arc::new(move || me.unpark()));
            source.store().reader_started();
            let fed = feed(source.as_ref(), sub, &view);
            source.store().reader_done();
            if let Err(e) = fed {
                if !view.is_released() {
                    let msg = format!("reading partition {:?}[{sub}] back failed: {e}", source.id());
                    log::warn!("creditflow: {msg}");
                    view.add_finished(Entry::Event(Event::ProducerFailed(msg)));
                }
            }
        })
        .map_err(|e| Error::Spill(format!("could not start a reader thread: {e}")))?;
    Ok(())
}

fn feed<S: Source>(source: &S, sub: usize, view: &Subpartition) -> Result<()> {
    let store = source.store();
    let mut pos = 0u64;
    let mut scratch = Vec::new();
    loop {
        // Fewer than READ_AHEAD when several readers share the partition's pool.
        while view.backlog() >= store.read_ahead(source.pool().stats().share) {
            if view.is_released() {
                return Ok(());
            }
            std::thread::park_timeout(POLL);
        }
        if view.is_released() {
            return Ok(());
        }
        let (entry, file) = match store.next(sub, pos, POLL) {
            Next::Entry(e, f) => (e, f),
            Next::Wait => continue,
            Next::Gone => {
                return Err(Error::PartitionNotFound(format!(
                    "{} (released while it was being read)",
                    source.id()
                )))
            }
        };
        match entry {
            Stored::Event(e) => {
                let last = matches!(e, Event::EndOfPartition | Event::ProducerFailed(_));
                view.add_finished(Entry::Event(e));
                if last {
                    return Ok(());
                }
            }
            // In memory: the reader reads the stored buffer itself (no copy, no segment).
            Stored::Mem(chunk) => view.add_finished(Entry::Buffer(chunk.reread())),
            Stored::Disk(extent) => {
                let file = file.ok_or(Error::PartitionNotFound(source.id().to_string()))?;
                file.read(extent, &mut scratch)?;
                drop(file);
                store.count_read_back(scratch.len());
                push(source.pool(), store, view, &scratch)?;
            }
        }
        pos += 1;
        store.consumed(sub, pos);
    }
}

/// Copies `data` into segments of `pool` and queues them as finished buffers of `view`, cut
/// at the view's (possibly debloated) buffer size.
fn push(pool: &LocalPool, store: &SpillStore, view: &Subpartition, mut data: &[u8]) -> Result<()> {
    while !data.is_empty() {
        let seg = segment_for(pool, store, view)?;
        let (mut builder, consumer) = new_buffer_limited(seg, view.buffer_size(usize::MAX));
        let n = builder.append(data);
        builder.finish();
        data = &data[n..];
        view.add_finished(Entry::Buffer(consumer));
    }
    Ok(())
}

/// A segment to read a spilled chunk back into. The pool can be full of other readers'
/// read-ahead that their consumers are not reading yet (a reader that started alone read
/// ahead more than its part once others started, or gates created since shrank the share):
/// the store spills what it holds in memory first, and a reader whose consumer is waiting
/// for it (nothing queued) takes one segment beyond the share rather than wait for those
/// readers.
fn segment_for(pool: &LocalPool, store: &SpillStore, view: &Subpartition) -> Result<PooledSegment> {
    loop {
        if let Some(seg) = pool.try_request() {
            return Ok(seg);
        }
        store.fit(pool)?;
        store.make_room(pool);
        if view.backlog() == 0 {
            if let Some(seg) = pool.try_request_one_more() {
                return Ok(seg);
            }
        }
        let mut check = || {
            if view.is_released() {
                Err(Error::Closed("reader"))
            } else {
                Ok(())
            }
        };
        let mut wait = Wait::timeout(Some(POLL), "a buffer for a spilled read").with_check(&mut check);
        match pool.request(&mut wait) {
            Ok(seg) => return Ok(seg),
            // Look again: the consumer may have taken everything queued meanwhile.
            Err(Error::Timeout(..)) => continue,
            Err(e) => return Err(e),
        }
    }
}
