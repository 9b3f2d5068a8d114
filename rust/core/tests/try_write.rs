//! `RecordWriter::try_write_to`: a write that needs no wait, or none at all. What a reader of
//! many links on one thread uses, which must never block on a full partition.

use std::time::Duration;

use arrow_array::Int64Array;
use creditflow_core::base::wait::Wait;
use creditflow_core::env::NetworkEnvironment;
use creditflow_core::partition::partitioner::Partitioner;
use creditflow_core::partition::spill::SpillKind;
use creditflow_core::partition::writer::RecordWriter;

mod support;

use support::{keys, spec};

/// An environment of 1 MiB.
fn env(handoff: bool) -> NetworkEnvironment {
    support::env(|c| {
        c.memory = 1 << 20;
        c.local_handoff = handoff;
    })
}

#[test]
fn a_try_write_queues_while_there_is_room_then_writes_nothing_until_a_reader_frees_some() {
    let env = env(true);
    let part = env.create_partition("t", 1).unwrap();
    let mut w = RecordWriter::new(part.clone(), Partitioner::RoundRobin);
    // The reader's gate first: its pool takes its share of the memory now, not half-way.
    let mut gate = env.create_input_gate(vec![spec(&env, "t", 0)]).unwrap();
    // 64 KiB batches into a 1 MiB pool: some fit, then the pool is full.
    let mut queued = 0i64;
    while w.try_write_to(&keys(queued * 8192, 8192), None, 0).unwrap() {
        queued += 1;
        assert!(queued < 64, "a 1 MiB pool took {queued} batches of 64 KiB");
    }
    assert!(queued >= 4, "only {queued} batches fitted");
    let m = part.metrics();
    assert_eq!(m.batches_written, queued as u64, "a refused try wrote nothing");
    assert_eq!(m.backlog, vec![queued as usize]);
    // Refused again, and nothing changes.
    assert!(!w.try_write_to(&keys(-1, 8192), None, 0).unwrap());
    assert_eq!(part.metrics().batches_written, queued as u64);
    // Bad input is an error, not a refusal.
    assert!(
        w.try_write_to(&keys(0, 1), None, 1).is_err(),
        "subpartition out of range"
    );
    // A reader that takes a batch makes room for the next try.
    let first = gate
        .next(&mut Wait::timeout(Some(Duration::from_secs(10)), "test"))
        .unwrap()
        .unwrap();
    let k = first.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
    assert_eq!(k.value(0), 0, "the first batch queued comes first");
    drop(first);
    assert!(w.try_write_to(&keys(queued * 8192, 8192), None, 0).unwrap());
    w.close().unwrap();
    let mut n = 1;
    while gate
        .next(&mut Wait::timeout(Some(Duration::from_secs(10)), "test"))
        .unwrap()
        .is_some()
    {
        n += 1;
    }
    assert_eq!(n, queued + 1, "every queued batch, once");
}

#[test]
fn a_try_write_to_a_spillable_or_serializing_partition_writes_nothing_and_write_to_then_does() {
    let spilling = env(true);
    let serializing = env(false);
    let parts = [
        spilling
            .create_spillable_partition("s", 1, SpillKind::Blocking, None)
            .unwrap(),
        serializing.create_partition("z", 1).unwrap(),
    ];
    for part in parts {
        let mut w = RecordWriter::new(part.clone(), Partitioner::RoundRobin);
        assert!(!w.try_write_to(&keys(0, 10), None, 0).unwrap(), "{}", part.id());
        assert_eq!(part.metrics().batches_written, 0, "{}", part.id());
        w.write_to(&keys(0, 10), None, 0, &mut Wait::forever()).unwrap();
        assert_eq!(part.metrics().batches_written, 1, "{}", part.id());
        w.close().unwrap();
    }
}
