//! Which thread frees a handed-off batch a remote reader was sent: the writer's, at its next
//! write, not the I/O thread that sent it (which would also free memory the writer's thread
//! allocated); the environment's flusher when the writer stays idle; the sender when the
//! writer has ended.

mod support;

use std::ptr::NonNull;
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use arrow_array::{Int64Array, RecordBatch};
use arrow_buffer::{Buffer, ScalarBuffer};
use arrow_schema::{DataType, Field, Schema};
use creditflow_core::env::NetworkEnvironment;
use creditflow_core::gate::InputGate;
use creditflow_core::partition::partitioner::Partitioner;
use creditflow_core::partition::writer::RecordWriter;
use support::{keys, spec, wait};

/// The thread that freed a batch's memory: its id and name.
type Freer = Arc<Mutex<Option<(ThreadId, String)>>>;

/// The memory of a batch's column: notes the thread that frees it.
struct Owned {
    values: Vec<i64>,
    freed_by: Freer,
}

impl Drop for Owned {
    fn drop(&mut self) {
        let me = std::thread::current();
        *self.freed_by.lock().unwrap() = Some((me.id(), me.name().unwrap_or_default().to_string()));
    }
}

/// A batch of `rows` keys whose column's memory notes the thread that frees it in the slot
/// returned.
fn noted(rows: usize) -> (RecordBatch, Freer) {
    let freed_by = Arc::new(Mutex::new(None));
    let owner = Arc::new(Owned {
        values: (0..rows as i64).collect(),
        freed_by: freed_by.clone(),
    });
    let ptr = NonNull::new(owner.values.as_ptr() as *mut u8).unwrap();
    // SAFETY: the values live as long as `owner`, which the buffer holds.
    let buffer = unsafe { Buffer::from_custom_allocation(ptr, rows * 8, owner) };
    let column = Int64Array::new(ScalarBuffer::new(buffer, 0, rows), None);
    let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
    (
        RecordBatch::try_new(schema, vec![Arc::new(column)]).unwrap(),
        freed_by,
    )
}

fn freed(slot: &Freer) -> Option<ThreadId> {
    slot.lock().unwrap().as_ref().map(|(id, _)| *id)
}

/// The name of the thread that freed it, once one has (within 10 s).
fn freer_name(slot: &Freer) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some((_, name)) = slot.lock().unwrap().as_ref() {
            return name.clone();
        }
        assert!(Instant::now() < deadline, "the batch sent was never freed");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A remote reader's channel to a partition of `producer`, and a writer that has written one
/// noted batch of 10,000 rows, which the reader has read.
struct OneSent {
    _envs: (NetworkEnvironment, NetworkEnvironment),
    gate: InputGate,
    writer: RecordWriter,
    freed_by: Freer,
}

fn one_sent(producer: NetworkEnvironment) -> OneSent {
    let consumer = support::env(|_| {});
    let part = producer.create_partition("p", 1).unwrap();
    let mut gate = consumer.create_input_gate(vec![spec(&producer, "p", 0)]).unwrap();
    let mut writer = RecordWriter::new(part, Partitioner::RoundRobin);
    let (batch, freed_by) = noted(10_000);
    writer.write(&batch, &mut wait(10)).unwrap();
    drop(batch);
    assert_eq!(gate.next(&mut wait(10)).unwrap().unwrap().num_rows(), 10_000);
    OneSent {
        _envs: (producer, consumer),
        gate,
        writer,
        freed_by,
    }
}

impl OneSent {
    fn close(mut self) {
        self.writer.close().unwrap();
        assert!(self.gate.next(&mut wait(10)).unwrap().is_none());
    }
}

#[test]
fn a_batch_sent_to_a_remote_reader_is_freed_by_the_writer_at_its_next_write() {
    // The flusher's passes as far apart as they get (it frees only what waited a whole pass).
    let mut s = one_sent(support::env(|c| c.buffer_timeout = Duration::from_secs(10)));
    // The sender retires the batch once its frame is written (just after the reader can have
    // it): the writer frees it at the first write after that.
    let mut writes = 0;
    while freed(&s.freed_by).is_none() {
        assert!(
            writes < 200,
            "the batch sent was not freed after {writes} more writes"
        );
        s.writer.write(&keys(0, 10), &mut wait(10)).unwrap();
        assert_eq!(s.gate.next(&mut wait(10)).unwrap().unwrap().num_rows(), 10);
        writes += 1;
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        freed(&s.freed_by),
        Some(std::thread::current().id()),
        "freed by another thread than the writer's"
    );
    s.close();
}

#[test]
fn a_batch_sent_after_its_writer_ended_is_freed_by_its_sender() {
    let producer = support::env(|_| {});
    let consumer = support::env(|_| {});
    // Two subpartitions, one never read: the partition is not read whole, so it stays
    // registered (a partition read whole releases itself, which would free the batch too).
    let part = producer.create_partition("p", 2).unwrap();
    let mut w = RecordWriter::new(part.clone(), Partitioner::RoundRobin);
    let (batch, freed_by) = noted(10_000);
    w.write_to(&batch, None, 0, &mut wait(10)).unwrap();
    drop(batch);
    w.close().unwrap();
    // Read only now: the batch is sent after the writer ended, and must not wait for a write
    // that will not come.
    let mut gate = consumer.create_input_gate(vec![spec(&producer, "p", 0)]).unwrap();
    assert_eq!(gate.next(&mut wait(10)).unwrap().unwrap().num_rows(), 10_000);
    assert!(gate.next(&mut wait(10)).unwrap().is_none());
    let name = freer_name(&freed_by);
    assert!(
        name.starts_with("creditflow-io"),
        "freed by {name:?}, not by its sender"
    );
    assert!(!part.is_released());
}

#[test]
fn a_batch_sent_for_a_writer_that_stays_idle_is_freed_by_the_flusher() {
    let s = one_sent(support::env(|_| {}));
    // No further write, the writer open: the flusher frees it within its period.
    assert_eq!(freer_name(&s.freed_by), "creditflow-flusher");
    s.close();
}
