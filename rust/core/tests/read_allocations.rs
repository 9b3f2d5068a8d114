//! What a steady stream of serialized batches allocates on the thread that reads them from a
//! partition of its own environment: each record is gathered into a block the gate used before
//! (given back when the batch that held it was dropped), not into a fresh allocation of the
//! record's size (glibc's sorted bins, or fresh pages for records of megabytes).

mod support;

use creditflow_core::partition::partitioner::Partitioner;
use creditflow_core::partition::writer::RecordWriter;
use support::alloc::{allocated_by, CountingAlloc};
use support::{keys, spec, wait};

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

/// 40 KB of `Int64` keys: a record over two 32 KiB segments.
const ROWS: usize = 5_000;

#[test]
fn a_local_reader_of_serialized_batches_gathers_records_into_reused_blocks() {
    let env = support::env(|c| {
        c.memory = 64 << 20;
        c.local_handoff = false;
    });
    let part = env.create_partition("serialized", 1).unwrap();
    let mut gate = env.create_input_gate(vec![spec(&env, "serialized", 0)]).unwrap();
    let mut w = RecordWriter::new(part.clone(), Partitioner::RoundRobin);
    let batch = keys(0, ROWS);
    let record = ROWS * 8;
    let mut per_read = Vec::new();
    for _ in 0..20 {
        w.write(&batch, &mut wait(10)).unwrap();
        w.flush();
        let (got, bytes) = allocated_by(|| gate.next(&mut wait(10)).unwrap().expect("the batch written"));
        assert_eq!(got, batch);
        per_read.push(bytes);
        // Dropping the batch gives its record's block back to the gate.
        drop(got);
    }
    assert!(
        per_read[2..].iter().all(|&n| n < record / 4),
        "bytes allocated by each read of a {record}-byte record: {per_read:?}"
    );
    w.close().unwrap();
    assert!(gate.next(&mut wait(10)).unwrap().is_none());
}
