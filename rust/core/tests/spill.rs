//! Blocking and hybrid partitions: the writer never waits for readers, what does not fit in
//! memory spills to files, and readers (local and remote) read the stored stream from the
//! start, in order, as often as the kind allows, until release.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::{Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use creditflow_core::base::config::Backoff;
use creditflow_core::base::error::Error;
use creditflow_core::base::wait::Wait;
use creditflow_core::env::{EnvConfig, NetworkEnvironment};
use creditflow_core::partition::partitioner::Partitioner;
use creditflow_core::partition::spill::SpillKind;
use creditflow_core::partition::writer::RecordWriter;
use creditflow_core::serde::Compression;
use creditflow_core::ResultPartition;

mod support;

use support::{spec, wait};

const SEGMENT: usize = 4096;
const MEMORY: usize = 64 * SEGMENT;

fn config(dir: &Path, max_spill: Option<u64>) -> EnvConfig {
    EnvConfig {
        memory: MEMORY,
        segment_size: SEGMENT,
        spill_dir: Some(dir.to_path_buf()),
        max_spill,
        request_backoff: Backoff {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(40),
        },
        ..EnvConfig::default()
    }
}

/// Batch `i`: 200 rows whose values encode `i`, plus a compressible text column.
fn batch(i: i64) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("s", DataType::Utf8, false),
    ]));
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from_iter_values((0..200).map(|r| i * 1000 + r))),
            Arc::new(StringArray::from_iter_values(
                (0..200).map(|r| format!("row {} of batch", r % 7)),
            )),
        ],
    )
    .unwrap()
}

fn first_key(b: &RecordBatch) -> i64 {
    b.column(0)
        .as_any()
        .downcast_ref::<Int64Array>()
        .unwrap()
        .value(0)
        / 1000
}

/// Batches written for 10× the environment's memory (serialized size).
fn ten_times_memory() -> i64 {
    let one = creditflow_core::serde::BatchEncoder::new(&batch(0).schema())
        .unwrap()
        .encode(&batch(0))
        .unwrap()
        .len();
    (10 * MEMORY / one) as i64 + 1
}

fn write(part: &Arc<ResultPartition>, n: i64) {
    let mut w = RecordWriter::new(part.clone(), Partitioner::Forward);
    for i in 0..n {
        // A writer that waited for a reader would time out here: nobody reads yet.
        w.write(
            &batch(i),
            &mut Wait::timeout(Some(Duration::from_secs(5)), "write"),
        )
        .unwrap();
    }
    w.close().unwrap();
}

/// Reads subpartition 0 of `part` at `from`'s address through a new gate of `reader`.
fn read_all(reader: &NetworkEnvironment, from: &NetworkEnvironment, id: &str) -> Result<Vec<i64>, Error> {
    let mut gate = reader.create_input_gate(vec![spec(from, id, 0)])?;
    let mut got = Vec::new();
    while let Some(b) = gate.next(&mut wait(20))? {
        assert_eq!(b, batch(first_key(&b)), "a batch arrived changed");
        got.push(first_key(&b));
    }
    Ok(got)
}

fn files_in(dir: &Path) -> usize {
    walk(dir)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "spill"))
        .count()
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        }
        out.push(p);
    }
    out
}

#[test]
fn blocking_writes_ten_times_memory_unread_then_local_and_remote_readers_read_it_twice() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let env = NetworkEnvironment::new(config(dir, None)).unwrap();
    let other = NetworkEnvironment::new(config(dir, None)).unwrap();
    let part = env
        .create_spillable_partition("b", 1, SpillKind::Blocking, None)
        .unwrap();
    let n = ten_times_memory();
    write(&part, n);
    let m = part.metrics().spill.unwrap();
    assert!(m.spilled_bytes as usize > 8 * MEMORY, "{m:?}");
    assert!(m.memory_segments <= MEMORY / SEGMENT, "{m:?}");
    assert_eq!(files_in(dir), 1);
    let want: Vec<i64> = (0..n).collect();
    for _ in 0..2 {
        assert_eq!(read_all(&env, &env, "b").unwrap(), want, "local reader");
        assert_eq!(read_all(&other, &env, "b").unwrap(), want, "remote reader");
    }
    assert!(part.metrics().spill.unwrap().read_back_bytes >= 4 * m.spilled_bytes);
    part.release();
    assert_eq!(files_in(dir), 0, "release removes the files");
    assert!(matches!(
        read_all(&env, &env, "b"),
        Err(Error::PartitionNotFound(_))
    ));
    assert!(matches!(
        read_all(&other, &env, "b"),
        Err(Error::PartitionNotFound(_))
    ));
    env.close();
    other.close();
    assert!(
        walk(dir).is_empty(),
        "close removes the directories: {:?}",
        walk(dir)
    );
}

#[test]
fn blocking_readers_wait_for_the_end_and_concurrent_readers_each_get_everything() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let env = Arc::new(NetworkEnvironment::new(config(dir, None)).unwrap());
    let part = env
        .create_spillable_partition("c", 1, SpillKind::Blocking, None)
        .unwrap();
    let n = ten_times_memory();
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let env = env.clone();
            std::thread::spawn(move || read_all(&env, &env, "c").unwrap())
        })
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    write(&part, n);
    for r in readers {
        assert_eq!(r.join().unwrap(), (0..n).collect::<Vec<_>>());
    }
}

#[test]
fn hybrid_readers_read_while_the_writer_writes_and_a_selective_one_reads_once() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let env = Arc::new(NetworkEnvironment::new(config(dir, None)).unwrap());
    let part = env
        .create_spillable_partition("h", 1, SpillKind::Hybrid { replay: false }, None)
        .unwrap();
    let reader = {
        let env = env.clone();
        std::thread::spawn(move || {
            let mut gate = env.create_input_gate(vec![spec(&env, "h", 0)]).unwrap();
            // The first batch arrives before the writer finishes (it waits for this one).
            let first = gate.next(&mut wait(20)).unwrap().unwrap();
            let mut got = vec![first_key(&first)];
            std::thread::sleep(Duration::from_millis(200)); // slow: the writer spills meanwhile
            while let Some(b) = gate.next(&mut wait(20)).unwrap() {
                got.push(first_key(&b));
            }
            got
        })
    };
    let n = ten_times_memory();
    let mut w = RecordWriter::new(part.clone(), Partitioner::Forward);
    w.write(&batch(0), &mut wait(20)).unwrap();
    w.flush();
    for i in 1..n {
        w.write(
            &batch(i),
            &mut Wait::timeout(Some(Duration::from_secs(5)), "write"),
        )
        .unwrap();
    }
    w.close().unwrap();
    assert_eq!(reader.join().unwrap(), (0..n).collect::<Vec<_>>());
    let m = part.metrics().spill.unwrap();
    assert!(m.spilled_bytes > 0, "{m:?}");
    assert!(m.read_back_bytes > 0, "{m:?}");
}

#[test]
fn hybrid_with_replay_is_read_again_from_the_start() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let env = NetworkEnvironment::new(config(dir, None)).unwrap();
    let part = env
        .create_spillable_partition("r", 1, SpillKind::Hybrid { replay: true }, Some(Compression::Lz4))
        .unwrap();
    let n = ten_times_memory();
    write(&part, n);
    let want: Vec<i64> = (0..n).collect();
    assert_eq!(read_all(&env, &env, "r").unwrap(), want);
    assert_eq!(read_all(&env, &env, "r").unwrap(), want);
}

#[test]
fn a_selective_hybrid_subpartition_has_one_reader() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let env = NetworkEnvironment::new(config(dir, None)).unwrap();
    let part = env
        .create_spillable_partition("o", 1, SpillKind::Hybrid { replay: false }, None)
        .unwrap();
    write(&part, 3);
    assert_eq!(read_all(&env, &env, "o").unwrap(), vec![0, 1, 2]);
    // Read once and finished: released like a pipelined partition.
    assert!(part.is_released());
}

#[test]
fn compression_shrinks_what_is_stored_and_reads_back_the_same() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let env = NetworkEnvironment::new(config(dir, None)).unwrap();
    let mut sizes = Vec::new();
    for (i, codec) in [None, Some(Compression::Lz4), Some(Compression::Zstd)]
        .into_iter()
        .enumerate()
    {
        let id = format!("z{i}");
        let part = env
            .create_spillable_partition(&id, 1, SpillKind::Blocking, codec)
            .unwrap();
        write(&part, 50);
        assert_eq!(read_all(&env, &env, &id).unwrap(), (0..50).collect::<Vec<_>>());
        sizes.push(part.metrics().spill.unwrap().stream_bytes);
    }
    assert!(sizes[1] < sizes[0] && sizes[2] < sizes[0], "{sizes:?}");
}

#[test]
fn at_max_spill_a_blocking_writer_fails_and_its_readers_get_the_failure_not_data() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let env = NetworkEnvironment::new(config(dir, Some(2 * MEMORY as u64))).unwrap();
    let part = env
        .create_spillable_partition("m", 1, SpillKind::Blocking, None)
        .unwrap();
    let mut w = RecordWriter::new(part.clone(), Partitioner::Forward);
    let err = (0..ten_times_memory())
        .find_map(|i| w.write(&batch(i), &mut wait(20)).err())
        .expect("the cap is reached");
    assert!(
        matches!(&err, Error::Spill(m) if m.contains("max_spill")),
        "{err}"
    );
    match read_all(&env, &env, "m") {
        Err(Error::ProducerFailed(m)) => assert!(m.contains("max_spill"), "{m}"),
        other => panic!("expected ProducerFailed, got {other:?}"),
    }
}

#[test]
fn at_max_spill_a_selective_hybrid_writer_backpressures_instead() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let env = Arc::new(NetworkEnvironment::new(config(dir, Some(MEMORY as u64))).unwrap());
    let part = env
        .create_spillable_partition("hc", 1, SpillKind::Hybrid { replay: false }, None)
        .unwrap();
    let n = ten_times_memory();
    let (tx, rx) = std::sync::mpsc::channel();
    let writer = {
        let part = part.clone();
        std::thread::spawn(move || {
            let mut w = RecordWriter::new(part, Partitioner::Forward);
            for i in 0..n {
                w.write(&batch(i), &mut Wait::forever()).unwrap();
                tx.send(i).unwrap();
            }
            w.close().unwrap();
        })
    };
    // Nobody reads: the writer fills memory, then the spill budget, then waits (no error).
    std::thread::sleep(Duration::from_millis(1500));
    let written = rx.try_iter().last().expect("some batches were written");
    assert!(
        written + 1 < n,
        "the writer did not wait at the cap ({written} of {n})"
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(rx.try_iter().count(), 0, "the writer is still waiting");
    let m = part.metrics().spill.unwrap();
    assert!(m.spilled_bytes > 0 && m.spilled_bytes <= MEMORY as u64, "{m:?}");
    // A reader drains it: the writer goes on and the reader gets everything in order.
    assert_eq!(read_all(&env, &env, "hc").unwrap(), (0..n).collect::<Vec<_>>());
    writer.join().unwrap();
}

/// Batch `i` with `rows` rows (0: an empty batch), values encoding `i`.
fn sized(i: i64, rows: usize) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
    RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(vec![i; rows]))]).unwrap()
}

mod props {
    use proptest::prelude::*;

    use super::*;

    /// What a writer does to a spillable partition.
    #[derive(Debug, Clone)]
    enum Op {
        /// A batch of this many rows (round robin: the writes go to subpartitions in turn).
        Write(usize),
        /// A user event to one subpartition (modulo the count), or to all.
        Event(Option<usize>),
        Flush,
    }

    fn ops() -> impl Strategy<Value = Vec<Op>> {
        prop::collection::vec(
            prop_oneof![
                6 => prop_oneof![Just(0usize), 1..64usize, 500..3000usize].prop_map(Op::Write),
                1 => prop::option::of(0..3usize).prop_map(Op::Event),
                1 => Just(Op::Flush),
            ],
            0..60,
        )
    }

    fn kind() -> impl Strategy<Value = SpillKind> {
        prop_oneof![
            Just(SpillKind::Blocking),
            Just(SpillKind::Hybrid { replay: true }),
            Just(SpillKind::Hybrid { replay: false }),
        ]
    }

    fn codec() -> impl Strategy<Value = Option<Compression>> {
        prop_oneof![
            Just(None),
            Just(Some(Compression::Lz4)),
            Just(Some(Compression::Zstd))
        ]
    }

    /// A batch's label: `b<i>:<rows>` (`b-1:0` for an empty one).
    fn label(i: i64, rows: usize) -> String {
        if rows == 0 {
            "b-1:0".into()
        } else {
            format!("b{i}:{rows}")
        }
    }

    /// What a reader of each of `subs` subpartitions should see, in order.
    fn expected(ops: &[Op], subs: usize) -> Vec<Vec<String>> {
        let mut out = vec![Vec::new(); subs];
        let mut next = 0;
        for (i, op) in ops.iter().enumerate() {
            match op {
                Op::Write(rows) => {
                    out[next].push(label(i as i64, *rows));
                    next = (next + 1) % subs;
                }
                Op::Event(None) => out.iter_mut().for_each(|o| o.push(format!("e{i}"))),
                Op::Event(Some(t)) => out[t % subs].push(format!("e{i}")),
                Op::Flush => {}
            }
        }
        out
    }

    fn read(env: &NetworkEnvironment, id: &str, s: usize) -> Vec<String> {
        let mut gate = env.create_input_gate(vec![spec(env, id, s)]).unwrap();
        let mut got = Vec::new();
        while let Some(item) = gate.next_item(&mut wait(20)).unwrap() {
            match item {
                creditflow_core::GateItem::Batch { batch, .. } => {
                    let k = batch.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
                    let i = if batch.num_rows() == 0 { -1 } else { k.value(0) };
                    got.push(label(i, batch.num_rows()));
                }
                creditflow_core::GateItem::Event { payload, .. } => {
                    got.push(String::from_utf8(payload).unwrap());
                }
                _ => {}
            }
        }
        got
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

        /// Whatever the writes, events, flushes, memory and codec, every reader gets each
        /// subpartition's stream exactly as written, and a replaying partition gives it again.
        #[test]
        fn readers_get_the_stream_as_written(
            subs in 1..4usize,
            ops in ops(),
            kind in kind(),
            codec in codec(),
            segments in 16..48usize,
        ) {
            let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
            let env = NetworkEnvironment::new(EnvConfig {
                memory: (segments + subs + 9) * SEGMENT,
                ..config(dir, None)
            })
            .unwrap();
            let part = env.create_spillable_partition("p", subs, kind, codec).unwrap();
            let mut w = RecordWriter::new(part.clone(), Partitioner::RoundRobin);
            for (i, op) in ops.iter().enumerate() {
                match op {
                    Op::Write(rows) => w.write(&sized(i as i64, *rows), &mut wait(20)).unwrap(),
                    Op::Event(Some(t)) => w.emit_event(format!("e{i}").as_bytes(), t % subs).unwrap(),
                    Op::Event(None) => w.broadcast_event(format!("e{i}").as_bytes()).unwrap(),
                    Op::Flush => w.flush(),
                }
            }
            w.close().unwrap();
            let want = expected(&ops, subs);
            let times = if kind.replays() { 2 } else { 1 };
            for (s, want) in want.iter().enumerate() {
                for _ in 0..times {
                    prop_assert_eq!(&read(&env, "p", s), want);
                }
            }
        }
    }
}

#[test]
fn a_spill_file_changed_on_disk_fails_its_readers_instead_of_delivering_other_bytes() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let env = NetworkEnvironment::new(config(dir, None)).unwrap();
    let part = env
        .create_spillable_partition("x", 1, SpillKind::Blocking, None)
        .unwrap();
    write(&part, ten_times_memory());
    let file = walk(dir)
        .into_iter()
        .find(|p| p.extension().is_some_and(|e| e == "spill"))
        .unwrap();
    // Flip bytes in the middle of the file (a batch's values, which Arrow cannot validate).
    let mut bytes = std::fs::read(&file).unwrap();
    let mid = bytes.len() / 2;
    for b in &mut bytes[mid..mid + 16] {
        *b ^= 0x5a;
    }
    std::fs::write(&file, &bytes).unwrap();
    match read_all(&env, &env, "x") {
        Err(Error::ProducerFailed(m)) => assert!(m.contains("corrupt") && m.contains("checksum"), "{m}"),
        other => panic!("expected ProducerFailed, got {other:?}"),
    }
}

#[test]
fn a_memory_reservation_makes_a_hybrid_partition_spill_down_and_is_given_back() {
    let scratch = tempfile::tempdir().unwrap();
    let env = NetworkEnvironment::new(config(scratch.path(), None)).unwrap();
    let total = MEMORY / SEGMENT;
    let part = env
        .create_spillable_partition("kept", 1, SpillKind::Hybrid { replay: true }, None)
        .unwrap();
    let n = ten_times_memory();
    write(&part, n);
    let in_memory = |p: &Arc<ResultPartition>| p.metrics().spill.unwrap().memory_segments;
    assert!(in_memory(&part) > total / 2, "the store fills its share first");

    let reserved = total / 2;
    let held = env.reserve_memory("window", reserved * SEGMENT - 1).unwrap();
    assert_eq!(held.segments(), reserved, "rounded up to whole segments");
    part.flush(); // what the environment's flusher does every buffer_timeout
    assert!(
        in_memory(&part) + reserved <= total,
        "{} segments in memory beside {reserved} reserved of {total}",
        in_memory(&part)
    );
    assert!(
        env.pool().allocated_segments() + reserved <= total,
        "segments allocated before are dropped: {} allocated beside {reserved} held of {total}",
        env.pool().allocated_segments()
    );
    match env.reserve_memory("too much", MEMORY) {
        Err(Error::InsufficientBuffers { .. }) => {}
        other => panic!("a reservation beyond the free memory must fail, got {other:?}"),
    }
    drop(held);
    assert!(env.metrics().segments_reserved < reserved, "dropped: given back");
    let want: Vec<i64> = (0..n).collect();
    assert_eq!(
        read_all(&env, &env, "kept").unwrap(),
        want,
        "the spilled rows read back"
    );
}

#[test]
fn readers_of_several_spilled_subpartitions_do_not_starve_each_other() {
    // Five readers of a replaying hybrid partition that spilled most of its data; they are
    // all open, and the consumer reads one to its end before the next, as an epoch that
    // interleaves runs may: the readers it does not read hold the read-ahead they queued,
    // and the one it reads still needs segments to read the file back into.
    let scratch = tempfile::tempdir().unwrap();
    let env = NetworkEnvironment::new(config(scratch.path(), None)).unwrap();
    let subs = 5;
    let part = env
        .create_spillable_partition("runs", subs, SpillKind::Hybrid { replay: true }, None)
        .unwrap();
    let n = ten_times_memory();
    let mut w = RecordWriter::new(part.clone(), Partitioner::RoundRobin);
    for i in 0..n {
        w.write(&batch(i), &mut wait(20)).unwrap();
    }
    w.close().unwrap();
    let mut gates: Vec<_> = (0..subs)
        .map(|sub| env.create_input_gate(vec![spec(&env, "runs", sub)]).unwrap())
        .collect();
    for (sub, gate) in gates.iter_mut().enumerate() {
        let mut got = Vec::new();
        while let Some(b) = gate.next(&mut wait(20)).expect("a reader waited for the others") {
            got.push(first_key(&b));
        }
        let want: Vec<i64> = (0..n).filter(|i| (i % subs as i64) as usize == sub).collect();
        assert_eq!(got, want, "subpartition {sub}");
    }
    assert!(part.metrics().spill.unwrap().read_back_chunks > 0);
}
