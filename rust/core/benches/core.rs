//! Criterion micro-benchmarks of creditflow-core's hot paths, through its public API only.
//!
//! | group | what one iteration does |
//! | --- | --- |
//! | `pool` | request + recycle segments: one, or 64 at once, from a warm local pool; and a cold round trip through the global pool (create local pool, take 64, recycle, destroy) |
//! | `subpartition` | push + poll of one handed-off batch (with its segment accounting); append a full segment of serialized bytes through `BufferBuilder` and read it back as a consumer |
//! | `partitioner` | Spark Murmur3 partition ids of 65,536 int64 keys for 4 targets; the full hash split of a 65,536-row batch into 4 pieces (hash + counting sort + take) |
//! | `serde` | `BatchEncoder::encode` of a 65,536-row batch; `RecordDeserializer::push` of the encoded record in 32 KiB pieces; both (a serialized round trip) |
//!
//! Batches have the columns of the Python benchmarks: `k1: int64, k2: int64, v: float64,
//! s: utf8` (about 8 characters). Run with `cargo bench -p creditflow-core` (add `-- --quick`
//! for a fast pass, or a filter such as `-- serde`).

use std::collections::VecDeque;
use std::hint::black_box;
use std::sync::Arc;

use arrow_array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

use creditflow_core::memory::{GlobalPool, LocalPool};
use creditflow_core::partition::buffer::new_buffer;
use creditflow_core::partition::partitioner::{Partitioner, Splitter};
use creditflow_core::partition::spark_hash::spark_partition_ids;
use creditflow_core::partition::subpartition::{Entry, LocalBatch, Polled, Subpartition};
use creditflow_core::partition::Handed;
use creditflow_core::serde::{batch_bytes, BatchEncoder, RecordDeserializer, RECORD_HEADER_LEN};

const SEGMENT: usize = 32 << 10;
const MEMORY: usize = 64 << 20;
const ROWS: usize = 65_536;

/// A deterministic pseudo-random stream (splitmix64), so the benches need no extra crate.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

fn batch(rows: usize, seed: u64) -> RecordBatch {
    let mut rng = Rng(seed);
    let k1: ArrayRef = Arc::new(Int64Array::from_iter_values((0..rows).map(|_| rng.next() as i64)));
    let k2: ArrayRef = Arc::new(Int64Array::from_iter_values(
        (0..rows).map(|_| (rng.next() % 1000) as i64),
    ));
    let v: ArrayRef = Arc::new(Float64Array::from_iter_values(
        (0..rows).map(|_| (rng.next() >> 11) as f64 / (1u64 << 53) as f64),
    ));
    let s: ArrayRef = Arc::new(StringArray::from_iter_values(
        (0..rows).map(|_| format!("k{}", rng.next() % 10_000_000)),
    ));
    RecordBatch::try_from_iter([("k1", k1), ("k2", k2), ("v", v), ("s", s)]).expect("batch")
}

fn global_pool() -> Arc<GlobalPool> {
    GlobalPool::new(MEMORY, SEGMENT).expect("global pool")
}

fn local_pool(global: &Arc<GlobalPool>, min: usize) -> LocalPool {
    global
        .create_local_pool("bench", min, usize::MAX, "bench")
        .expect("local pool")
}

fn bench_pool(c: &mut Criterion) {
    let mut g = c.benchmark_group("pool");
    let global = global_pool();
    let local = local_pool(&global, 65);

    g.throughput(Throughput::Elements(1));
    g.bench_function("request+recycle 1 (warm local pool)", |b| {
        b.iter(|| drop(black_box(local.try_request().expect("segment"))))
    });

    g.throughput(Throughput::Elements(64));
    g.bench_function("request+recycle 64 at once (warm local pool)", |b| {
        b.iter(|| drop(black_box(local.try_request_many(64).expect("64 segments"))))
    });
    drop(local);

    g.bench_function("create local pool, take 64 from global, recycle, destroy", |b| {
        b.iter(|| {
            let pool = local_pool(&global, 1);
            drop(black_box(pool.try_request_many(64).expect("64 segments")));
            pool.destroy();
        })
    });
    g.finish();
}

fn bench_subpartition(c: &mut Criterion) {
    let mut g = c.benchmark_group("subpartition");
    let global = global_pool();
    let pool = local_pool(&global, 2);
    let sub = Subpartition::new(0);
    let small = batch(1024, 1);
    let bytes = small.get_array_memory_size();

    g.throughput(Throughput::Elements(1));
    g.bench_function("hand-off batch push+poll", |b| {
        b.iter(|| {
            let segments = pool.try_reserve(1).expect("segment");
            sub.add_finished(Entry::Batch(LocalBatch {
                token: None,
                batch: Handed::Batch(small.clone()),
                bytes,
                segments,
            }));
            match sub.poll() {
                Some(Polled::Batch(local)) => black_box(local.batch.num_rows()),
                _ => panic!("expected the batch back"),
            }
        })
    });

    // A full segment of serialized bytes, appended in 4 KiB pieces, then read by the consumer.
    let data: Vec<u8> = (0..SEGMENT).map(|i| i as u8).collect();
    g.throughput(Throughput::Bytes(SEGMENT as u64));
    g.bench_function("serialized buffer append 32 KiB + consumer read", |b| {
        b.iter(|| {
            let (mut builder, consumer) = new_buffer(pool.try_request().expect("segment"));
            sub.add_unfinished_buffer(consumer);
            for piece in data.chunks(4096) {
                builder.append(piece);
            }
            builder.finish();
            sub.buffer_finished();
            let mut read = 0usize;
            while let Some(polled) = sub.poll() {
                match polled {
                    Polled::Data(slice) => read += black_box(slice.as_slice()).len(),
                    _ => panic!("expected bytes"),
                }
            }
            assert_eq!(read, SEGMENT);
        })
    });
    g.finish();
}

fn bench_partitioner(c: &mut Criterion) {
    let mut g = c.benchmark_group("partitioner");
    let big = batch(ROWS, 2);
    g.throughput(Throughput::Elements(ROWS as u64));

    let mut ids = Vec::new();
    g.bench_function("spark partition ids, 65536 int64 keys, n=4", |b| {
        b.iter(|| {
            spark_partition_ids(&[big.column(0).as_ref()], ROWS, 4, &mut ids).expect("ids");
            black_box(ids.len())
        })
    });

    // Two subpartitions (rows sorted in runs side by side) and four (one counter each).
    for n in [2, 4] {
        let mut splitter =
            Splitter::new(Partitioner::Hash(vec!["k1".into()]), &big.schema()).expect("splitter");
        let pieces = splitter.split(&big, n).expect("split");
        assert_eq!(pieces.len(), n);
        assert_eq!(pieces.iter().map(|p| p.batch.num_rows()).sum::<usize>(), ROWS);
        g.bench_function(format!("hash split 65536 rows to {n}"), |b| {
            b.iter(|| black_box(splitter.split(black_box(&big), n).expect("split")))
        });
    }
    g.finish();
}

/// The stream bytes of one batch-only record (after the first, schema-carrying record).
fn encoded(encoder: &mut BatchEncoder, batch: &RecordBatch) -> Vec<u8> {
    let record = encoder.encode(batch).expect("encode");
    let mut out = Vec::with_capacity(record.len());
    for chunk in record.chunks() {
        out.extend_from_slice(chunk);
    }
    out
}

fn bench_serde(c: &mut Criterion) {
    let mut g = c.benchmark_group("serde");
    let big = batch(ROWS, 3);
    g.throughput(Throughput::Bytes(big.get_array_memory_size() as u64));

    // The first record of a stream carries the schema; the benches look at the later ones.
    let mut encoder = BatchEncoder::new(&big.schema()).expect("encoder");
    let first = encoded(&mut encoder, &big);
    let record = encoded(&mut encoder, &big);
    let max_record = 1 << 30;
    let mut deserializer = RecordDeserializer::new(max_record);
    let mut out = VecDeque::new();
    deserializer.push(&first, &mut out).expect("first record");
    deserializer.push(&record, &mut out).expect("second record");
    assert_eq!(out.len(), 2);
    assert_eq!(out[1], big);
    out.clear();

    // Counted for every batch written and read (the partitions' and gates' byte metrics).
    let small = batch(1024, 3);
    g.bench_function("batch_bytes, 1024 rows of 4 columns", |b| {
        b.iter(|| batch_bytes(std::hint::black_box(&small)))
    });
    g.bench_function("BatchEncoder::encode 65536 rows", |b| {
        b.iter(|| black_box(encoder.encode(black_box(&big)).expect("encode").len()))
    });

    g.bench_function("RecordDeserializer::push 65536 rows in 32 KiB pieces", |b| {
        b.iter(|| {
            for piece in record.chunks(SEGMENT) {
                deserializer.push(piece, &mut out).expect("push");
            }
            black_box(out.pop_front().expect("a batch"))
        })
    });

    // What a shared-memory consumer does with a record decoded in place: no copy, only the
    // decoding and its validation.
    let whole: arrow_buffer::Buffer = {
        let mut m = arrow_buffer::MutableBuffer::with_capacity(record.len());
        m.extend_from_slice(&record[RECORD_HEADER_LEN..]);
        m.into()
    };
    g.bench_function(
        "RecordDeserializer::push_record 65536 rows (decoded in place)",
        |b| {
            b.iter(|| {
                deserializer
                    .push_record(whole.clone(), &mut out)
                    .expect("push_record");
                black_box(out.pop_front().expect("a batch"))
            })
        },
    );

    g.bench_function("encode + copy into segments + push, 65536 rows", |b| {
        let global = global_pool();
        let pool = local_pool(&global, 128);
        let mut segments = Vec::new();
        b.iter(|| {
            // Sender: copy the IPC parts into 32 KiB segments (the one sending-side copy).
            let record = encoder.encode(&big).expect("encode");
            let mut current = new_buffer(pool.try_request().expect("segment"));
            for mut chunk in record.chunks() {
                while !chunk.is_empty() {
                    let n = current.0.append(chunk);
                    chunk = &chunk[n..];
                    if current.0.remaining() == 0 {
                        let full =
                            std::mem::replace(&mut current, new_buffer(pool.try_request().expect("segment")));
                        full.0.finish();
                        segments.push(full.1);
                    }
                }
            }
            current.0.finish();
            segments.push(current.1);
            // Receiver: reassemble and decode; the segments are recycled as they are read.
            for mut consumer in segments.drain(..) {
                if let (Some(slice), _) = consumer.read_available() {
                    deserializer.push(slice.as_slice(), &mut out).expect("push");
                }
            }
            black_box(out.pop_front().expect("a batch"))
        })
    });
    g.finish();
}

criterion_group!(
    benches,
    bench_pool,
    bench_subpartition,
    bench_partitioner,
    bench_serde
);
criterion_main!(benches);
