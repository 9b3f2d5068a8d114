//! What a steady stream of large writes allocates on the writer's thread: a hand-off write of a
//! batch of megabytes reserves a segment per 32 KiB, and the list of them is used again from a
//! recycled reservation instead of being allocated for every write (a kilobyte or more: glibc
//! consolidates every small free chunk before serving such a request).

mod support;

use creditflow_core::partition::partitioner::Partitioner;
use creditflow_core::partition::writer::RecordWriter;
use support::alloc::{large_allocations_by, CountingAlloc};
use support::{keys, spec, wait};

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

/// 2 MiB of `Int64` keys: 64 segments of the default 32 KiB.
const ROWS: usize = 262_144;

#[test]
fn a_steady_stream_of_large_hand_off_writes_allocates_nothing_large_on_the_writer_thread() {
    let env = support::env(|c| c.memory = 64 << 20);
    let part = env.create_partition("big", 1).unwrap();
    let mut gate = env.create_input_gate(vec![spec(&env, "big", 0)]).unwrap();
    let mut w = RecordWriter::new(part.clone(), Partitioner::RoundRobin);
    let batch = keys(0, ROWS);
    let mut large = Vec::new();
    for _ in 0..12 {
        let ((), n) = large_allocations_by(|| w.write(&batch, &mut wait(10)).unwrap());
        large.push(n);
        let got = gate.next(&mut wait(10)).unwrap().expect("the batch written");
        assert_eq!(got.num_rows(), ROWS);
        // Dropping the batch recycles its reservation (and the list of its segments).
        drop(got);
    }
    assert_eq!(part.metrics().batches_written, 12);
    assert!(
        large[2..].iter().all(|&n| n == 0),
        "large allocations on the writer's thread, write by write: {large:?}"
    );
    w.close().unwrap();
    assert!(gate.next(&mut wait(10)).unwrap().is_none());
}
