//! Pieces a writing task put in its writer link's heap reach the reading task where they lie:
//! whole, in order, never changed while held, their chunks freed for the writer once dropped.

use arrow_array::{DictionaryArray, Int32Array};

use super::processes::{child, expect_line, kill};
use super::*;
use crate::partition::partitioner::Splitter;

/// Nonempty pieces `batch` splits into for `n` subpartitions by key `k`.
fn pieces(batch: &RecordBatch, n: usize) -> usize {
    let mut s = Splitter::new(Partitioner::Hash(vec!["k".into()]), batch.schema_ref()).unwrap();
    s.split(batch, n).unwrap().len()
}

/// A deep copy: what a batch held must still read as when it arrived.
fn copy(batch: &RecordBatch) -> RecordBatch {
    let columns = batch
        .columns()
        .iter()
        .map(|c| arrow_array::make_array(c.to_data().into_builder().build().unwrap()))
        .map(|a| arrow_select::concat::concat(&[a.as_ref()]).unwrap())
        .collect();
    RecordBatch::try_new(batch.schema(), columns).unwrap()
}

/// Writes `count` batches split by `k` for 2 subpartitions and closes: every `small`-th of 10
/// rows (its pieces go through the ring), the others of 40,000 (theirs lie in the heap). The
/// keys written, and the nonempty pieces they made.
fn write_mixed(w: &mut AttachedWriter, count: usize, small: usize) -> (Vec<i64>, usize) {
    let (mut first, mut sent, mut total) = (0i64, Vec::new(), 0usize);
    for i in 0..count {
        let rows = if i % small == small - 1 { 10 } else { 40_000 };
        let b = batch(first, rows, 8);
        total += pieces(&b, 2);
        w.write(&b, &mut forever()).unwrap();
        sent.extend(first..first + rows as i64);
        first += rows as i64;
    }
    w.close(&mut forever()).unwrap();
    (sent, total)
}

/// That `got` holds every key of `sent`, each subpartition's in the order written.
fn all_in_order(got: BTreeMap<usize, Vec<i64>>, sent: Vec<i64>) {
    let mut all: Vec<i64> = got.values().flatten().copied().collect();
    all.sort_unstable();
    assert_eq!(all, sent);
    assert!(got.values().all(|keys| keys.windows(2).all(|w| w[0] < w[1])));
}

#[test]
fn pieces_in_a_writer_s_heap_reach_the_reading_task_uncopied_in_order_and_whole() {
    let s = service("in-place", 64 << 20);
    let (a, b) = (attach(&s), attach(&s));
    let p = a.create_partition("p", 2, None, None).unwrap();
    let mut w = p.writer(Partitioner::Hash(vec!["k".into()])).unwrap();
    let mut g = b.create_input_gate(specs(s.address(), "p", 2)).unwrap();
    let reader = std::thread::spawn(move || drain(&mut g));
    let (sent, total) = write_mixed(&mut w, 40, 4);
    all_in_order(reader.join().unwrap(), sent);
    let m = s.metrics();
    assert_eq!(m.batches_in_place + m.batches_copied, total, "{m:?}");
    assert!(m.batches_in_place > 0 && m.batches_copied >= 10, "{m:?}");
}

#[test]
fn pieces_the_service_queues_undecoded_are_decoded_by_a_gate_of_its_own_environment() {
    // The service hands a writer's pieces over as they lie; a gate that yields batches (here
    // one of the service's own environment, in process) decodes and checks each.
    let s = service("undecoded", 64 << 20);
    let a = attach(&s);
    let p = a.create_partition("p", 2, None, None).unwrap();
    let mut w = p.writer(Partitioner::Hash(vec!["k".into()])).unwrap();
    let mut g = s
        .environment()
        .create_input_gate(specs(s.address(), "p", 2))
        .unwrap();
    let reader = std::thread::spawn(move || drain_items(|| g.next_item(&mut forever()).unwrap()));
    let (sent, _) = write_mixed(&mut w, 12, 3);
    all_in_order(reader.join().unwrap(), sent);
}

#[test]
fn split_pieces_arrive_as_the_partitioner_splits_them_written_directly_or_taken_first() {
    let s = service("direct", 64 << 20);
    let (a, b) = (attach(&s), attach(&s));
    let p = a.create_partition("p", 3, None, None).unwrap();
    let mut w = p.writer(Partitioner::Hash(vec!["k".into()])).unwrap();
    let mut g = b.create_input_gate(specs(s.address(), "p", 3)).unwrap();
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("text", DataType::Utf8, true),
        Field::new("x", DataType::Float64, true),
    ]));
    // Batches with and without nulls, large (pieces in the heap) and small (inline), each
    // sliced from a larger one; those with nulls are taken into new batches first, the others
    // written straight into the heap, all in one stream.
    let make = |i: usize| {
        let rows = if i % 3 == 2 { 9 } else { 30_000 };
        let skip = i % 5;
        let first = (i * 100_000) as i64;
        let k: ArrayRef = Arc::new(Int64Array::from_iter_values(first..first + (rows + skip) as i64));
        let text: ArrayRef =
            Arc::new(StringArray::from_iter((0..rows + skip).map(|r| {
                (i.is_multiple_of(2) || !r.is_multiple_of(7)).then(|| format!("row {r} of {i}"))
            })));
        let x: ArrayRef = Arc::new(arrow_array::Float64Array::from_iter_values(
            (0..rows + skip).map(|r| r as f64 / 4.0),
        ));
        RecordBatch::try_new(schema.clone(), vec![k, text, x])
            .unwrap()
            .slice(skip, rows)
    };
    let mut splitter = Splitter::new(Partitioner::Hash(vec!["k".into()]), &schema).unwrap();
    let mut want: BTreeMap<usize, Vec<RecordBatch>> = BTreeMap::new();
    for i in 0..12 {
        let b = make(i);
        for piece in splitter.split(&b, 3).unwrap() {
            want.entry(piece.subpartition).or_default().push(piece.batch);
        }
        w.write(&b, &mut forever()).unwrap();
    }
    w.close(&mut forever()).unwrap();
    let mut got: BTreeMap<usize, Vec<RecordBatch>> = BTreeMap::new();
    while let Some(item) = g.next_item(&mut forever()).unwrap() {
        if let GateItem::Batch { channel, batch, .. } = item {
            got.entry(channel).or_default().push(batch);
        }
    }
    assert_eq!(got, want);
    // The 8 large batches' pieces lay in the heap, the small ones' went inline.
    let m = s.metrics();
    let pieces: usize = want.values().map(Vec::len).sum();
    assert_eq!(
        (m.batches_in_place, m.batches_copied),
        (8 * 3, pieces - 8 * 3),
        "{m:?}"
    );
}

#[test]
fn a_piece_held_by_the_reader_never_changes_and_dropped_pieces_free_the_writer_s_heap() {
    let s = service("held", 64 << 20);
    let (a, b) = (attach(&s), attach(&s));
    let p = a.create_partition("p", 1, None, None).unwrap();
    let mut w = p.writer(Partitioner::Forward).unwrap();
    let mut g = b.create_input_gate(specs(s.address(), "p", 1)).unwrap();
    let next = |g: &mut AttachedGate| g.next(&mut forever()).unwrap().unwrap();
    // About 400 KB each (8-byte keys, 12-byte texts and their offsets).
    w.write(&batch(0, 20_000, 12), &mut forever()).unwrap();
    let held = next(&mut g);
    let was = copy(&held);
    assert_eq!(s.metrics().batches_in_place, 1);
    // While it is held, twice what the writer link's heap holds goes by, so its chunks would
    // have been written again were they free.
    let more = 2 * a.writer_heap() / (20_000 * 24);
    let mut first = 20_000i64;
    for _ in 0..more {
        w.write(&batch(first, 20_000, 12), &mut forever()).unwrap();
        let got = next(&mut g);
        assert_eq!(got, batch(first, 20_000, 12));
        first += 20_000;
    }
    assert_eq!(held, was, "a held batch changed");
    assert_eq!(held, batch(0, 20_000, 12));
    // Dropped as read, they freed their chunks: all went in place but the held one's.
    let m = s.metrics();
    assert_eq!((m.batches_in_place, m.batches_copied), (more + 1, 0), "{m:?}");
    drop(held);
    w.close(&mut forever()).unwrap();
    assert!(g.next(&mut forever()).unwrap().is_none());
}

#[test]
fn a_dictionary_column_travels_in_every_piece() {
    let s = service("dictionary", 64 << 20);
    let (a, b) = (attach(&s), attach(&s));
    let p = a.create_partition("p", 2, None, None).unwrap();
    let mut w = p.writer(Partitioner::Hash(vec!["k".into()])).unwrap();
    let mut g = b.create_input_gate(specs(s.address(), "p", 2)).unwrap();
    let rows = 60_000usize;
    let words: ArrayRef = Arc::new(StringArray::from_iter_values(
        (0..100).map(|i| format!("word-{i:04}")),
    ));
    let make = |round: i64| {
        let k: ArrayRef = Arc::new(Int64Array::from_iter_values(
            round * 1_000_000..round * 1_000_000 + rows as i64,
        ));
        let keys = Int32Array::from_iter_values((0..rows).map(|i| ((i as i64 + round) % 100) as i32));
        let d: ArrayRef = Arc::new(DictionaryArray::try_new(keys, words.clone()).unwrap());
        RecordBatch::try_from_iter([("k", k), ("w", d)]).unwrap()
    };
    for round in 0..3 {
        w.write(&make(round), &mut forever()).unwrap();
    }
    w.close(&mut forever()).unwrap();
    let mut seen = 0;
    while let Some(batch) = g.next(&mut forever()).unwrap() {
        let k = batch.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
        let d = batch
            .column(1)
            .as_any()
            .downcast_ref::<DictionaryArray<arrow_array::types::Int32Type>>()
            .unwrap();
        let values = d.values().as_any().downcast_ref::<StringArray>().unwrap();
        for (k, key) in k.values().iter().zip(d.keys().values()) {
            let (round, i) = (k / 1_000_000, k % 1_000_000);
            assert_eq!(
                values.value(*key as usize),
                format!("word-{:04}", (i + round) % 100)
            );
        }
        seen += batch.num_rows();
    }
    assert_eq!(seen, 3 * rows);
    assert!(s.metrics().batches_in_place > 0, "{:?}", s.metrics());
}

#[test]
fn a_killed_writer_s_pieces_still_reach_the_reader_from_its_heap_then_the_failure() {
    let s = service("killed-in-place", 64 << 20);
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let rows = 30_000usize;
    let (mut task, mut out) = child(
        "host::tests::processes::child_task",
        &[
            ("SERVICE", s.name().into()),
            ("PARTITION", "k".into()),
            ("SILENT", silent.local_addr().unwrap().to_string()),
            ("ROWS", rows.to_string()),
        ],
    );
    expect_line(&mut out, "WROTE");
    let pid = format!("pid {}", task.id());
    kill(&mut task);
    // The writer is gone; what it put in its link's heap is read there all the same.
    let reader = attach(&s);
    let mut g = reader.create_input_gate(specs(s.address(), "k", 1)).unwrap();
    let mut got = 0;
    let err = loop {
        match g.next(&mut forever()) {
            Ok(Some(b)) => {
                assert_eq!(b, batch(got as i64, rows, 4));
                got += rows;
            }
            Ok(None) => panic!("the partition of a killed writer ended well"),
            Err(e) => break e,
        }
    };
    assert_eq!(got, 5 * rows);
    assert!(
        matches!(&err, Error::ProducerFailed(m) if m.contains(&pid)),
        "{err}"
    );
    assert_eq!(s.metrics().batches_in_place, 5, "{:?}", s.metrics());
}

/// Writes `count` batches of about 480 KB to a partition's only subpartition (each one piece
/// in the writer link's heap) and flushes.
fn write_large(w: &mut AttachedWriter, count: usize) {
    for i in 0..count {
        w.write(&batch(i as i64 * 20_000, 20_000, 12), &mut forever())
            .unwrap();
    }
    w.flush(&mut forever()).unwrap();
}

#[test]
fn pieces_a_reader_let_go_unread_go_back_to_the_writer_s_heap_and_a_held_one_stays() {
    let s = service("let-go", 64 << 20);
    let (a, b) = (attach(&s), attach(&s));
    let p = a.create_partition("p", 1, None, None).unwrap();
    let mut w = p.writer(Partitioner::Forward).unwrap();
    let mut g = b.create_input_gate(specs(s.address(), "p", 1)).unwrap();
    write_large(&mut w, 6);
    let held = g.next(&mut forever()).unwrap().unwrap();
    assert_eq!(held, batch(0, 20_000, 12));
    // Every piece is on the gate's link, handed over in place; five of them unread.
    wait_until(
        || s.metrics().batches_in_place == 6,
        "the pieces to be handed over",
    );
    let one = w.heap_chunks_in_use() / 6;
    assert!(one > 0);
    drop(g);
    // The service frees what the reader can no longer read, not what it holds.
    wait_until(
        || w.heap_chunks_in_use() == one,
        "the unread pieces' chunks to be freed",
    );
    assert_eq!(s.metrics().pieces_reclaimed, 5, "{:?}", s.metrics());
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(w.heap_chunks_in_use(), one, "the held piece's chunks were freed");
    assert_eq!(held, batch(0, 20_000, 12));
    drop(held);
    assert_eq!(w.heap_chunks_in_use(), 0);
    assert_eq!(s.metrics().pieces_reclaimed, 5);
}

#[test]
fn pieces_a_killed_reader_held_or_never_read_go_back_to_the_writer_s_heap() {
    let s = service("reader-killed", 64 << 20);
    let a = attach(&s);
    let p = a.create_partition("held", 1, None, None).unwrap();
    let mut w = p.writer(Partitioner::Forward).unwrap();
    let (mut task, mut out) = child(
        "host::tests::processes::child_reader",
        &[("SERVICE", s.name().into()), ("PARTITION", "held".into())],
    );
    write_large(&mut w, 5);
    // It holds two batches; the other three are on its link, unread.
    expect_line(&mut out, "HOLDING");
    wait_until(
        || s.metrics().batches_in_place == 5,
        "the pieces to be handed over",
    );
    assert_eq!(w.heap_chunks_in_use() % 5, 0);
    assert!(w.heap_chunks_in_use() > 0);
    kill(&mut task);
    wait_until(
        || w.heap_chunks_in_use() == 0,
        "the killed reader's pieces to be freed",
    );
    assert_eq!(s.metrics().pieces_reclaimed, 5, "{:?}", s.metrics());
}

#[test]
fn a_writer_s_heap_is_its_task_s_memory_in_whole_chunks_within_bounds() {
    let s = service("heap-size", 64 << 20);
    let heap = |memory: usize| Attachment::connect(s.name(), 0, memory).unwrap().writer_heap();
    assert_eq!(heap(8 << 20), 8 << 20);
    assert_eq!(heap((1 << 20) + 1), (1 << 20) + (64 << 10));
    assert_eq!(heap(0), 1 << 20);
    assert_eq!(heap(100), 1 << 20);
    assert_eq!(heap(3 << 30), 1 << 30);
    assert_eq!(heap(usize::MAX), 1 << 30);
    // The service checks what a task asks for: a heap it would not make is refused, clearly,
    // and the session goes on.
    let a = attach(&s);
    let _p = a.create_partition("p", 1, None, None).unwrap();
    for bad in [
        0u64,
        4096,
        (1 << 20) + 1,
        (1 << 20) - (64 << 10),
        (1 << 30) + (64 << 10),
        u64::MAX,
    ] {
        let e = a
            .ask(Request::OpenWriter {
                partition: "p".into(),
                partitioner: Partitioner::Forward,
                heap: bad,
            })
            .unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{bad}: {e:?}");
        assert!(e.to_string().contains(&format!("heap of {bad} bytes")), "{e}");
    }
    let ok = Request::OpenWriter {
        partition: "p".into(),
        partitioner: Partitioner::Forward,
        heap: 1 << 20,
    };
    assert!(matches!(a.ask(ok).unwrap(), Reply::Link { .. }));
}

/// Batches of `rows` rows a writer of a task with `memory` puts in place while the reading task
/// holds every batch it read (so no chunk of the writer's heap is freed), out of `batches`.
fn held_in_place(s: &HostService, partition: &str, memory: usize, batches: usize) -> usize {
    let a = Attachment::connect(s.name(), 0, memory).unwrap();
    let b = attach(s);
    let p = a.create_partition(partition, 1, None, None).unwrap();
    let mut w = p.writer(Partitioner::Forward).unwrap();
    let mut g = b.create_input_gate(specs(s.address(), partition, 1)).unwrap();
    let before = s.metrics().batches_in_place;
    let mut held = Vec::new();
    for i in 0..batches {
        let sent = batch(i as i64 * 20_000, 20_000, 12);
        w.write(&sent, &mut forever()).unwrap();
        let got = g.next(&mut forever()).unwrap().unwrap();
        assert_eq!(got, sent);
        held.push(got);
    }
    w.close(&mut forever()).unwrap();
    assert!(g.next(&mut forever()).unwrap().is_none());
    s.metrics().batches_in_place - before
}

#[test]
fn a_writer_s_heap_holds_as_many_pieces_as_its_task_s_memory_allows() {
    let s = service("heap-follows", 64 << 20);
    // About 480 KB a batch (20,000 rows of an 8-byte key, a 12-byte text and its offset): eight
    // 64 KiB chunks in a heap.
    let piece = 8 * (64 << 10);
    for (i, memory) in [2usize << 20, 8 << 20].into_iter().enumerate() {
        let in_place = held_in_place(&s, &format!("p{i}"), memory, 24);
        assert_eq!(in_place, memory / piece, "{memory}-byte heap");
    }
}
