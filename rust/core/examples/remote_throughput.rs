//! Throughput of one remote channel between two environments in this process (no Python):
//! `cargo run --release -p creditflow-core --example remote_throughput [batches] [segment_size]`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::{Float64Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use creditflow_core::base::config::ChannelSpec;
use creditflow_core::base::wait::Wait;
use creditflow_core::env::{EnvConfig, NetworkEnvironment};
use creditflow_core::partition::partitioner::Partitioner;
use creditflow_core::partition::writer::RecordWriter;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let batches: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(1000);
    let seg: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(32 << 10);
    let n = 65536;
    let schema = Arc::new(Schema::new(vec![
        Field::new("a", DataType::Int64, false),
        Field::new("b", DataType::Float64, false),
        Field::new("c", DataType::Utf8, false),
    ]));
    let batch = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from_iter_values(0..n)),
            Arc::new(Float64Array::from_iter_values((0..n).map(|i| i as f64))),
            Arc::new(StringArray::from_iter_values((0..n).map(|i| format!("s{i}")))),
        ],
    )
    .unwrap();
    let cfg = |_: ()| EnvConfig {
        memory: 64 << 20,
        segment_size: seg,
        ..EnvConfig::default()
    };
    let producer = NetworkEnvironment::new(cfg(())).unwrap();
    let consumer = NetworkEnvironment::new(cfg(())).unwrap();
    let part = producer.create_partition("b", 1).unwrap();
    let spec = ChannelSpec {
        address: producer.address().into(),
        partition_id: "b".into(),
        subpartition: 0,
    };
    let mut gate = consumer.create_input_gate(vec![spec]).unwrap();
    let b = batch.clone();
    let t = std::thread::spawn(move || {
        let mut w = RecordWriter::new(part, Partitioner::Forward);
        for _ in 0..batches {
            w.write(&b, &mut Wait::forever()).unwrap();
        }
        w.close().unwrap();
    });
    let per_batch = batch.get_array_memory_size();
    let mut bytes = 0usize;
    let mut start = None;
    while let Some(b) = gate
        .next(&mut Wait::timeout(Some(Duration::from_secs(30)), "next"))
        .unwrap()
    {
        if start.is_none() {
            start = Some(Instant::now());
        } else {
            assert_eq!(b.num_rows(), n as usize);
            bytes += per_batch;
        }
    }
    t.join().unwrap();
    let secs = start.unwrap().elapsed().as_secs_f64();
    println!(
        "{:.2} GB/s ({} batches, segment {seg})",
        bytes as f64 / secs / 1e9,
        batches
    );
}
