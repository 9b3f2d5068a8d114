//! Overdraft buffers (Flink 1.16+): a writer half-way through a record that spans many
//! segments may borrow a few segments beyond its pool's share to finish the record instead of
//! stalling mid-record; the borrowed segments go back as soon as they are read.

use std::sync::Arc;
use std::time::Duration;

use arrow_array::{Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use creditflow_core::base::config::ChannelSpec;
use creditflow_core::base::error::Error;
use creditflow_core::base::wait::Wait;
use creditflow_core::env::{EnvConfig, NetworkEnvironment};
use creditflow_core::partition::partitioner::Partitioner;
use creditflow_core::partition::writer::RecordWriter;

const SEGMENT: usize = 4096;

/// 20 segments; the partition (serialized, so records fill segments) and a gate with one
/// local channel. The gate's pool is capped at `floating_buffers` = 8 and unused (a local
/// channel reads the subpartition directly), so the partition's share is 12 and the global
/// pool has 8 free segments to lend.
fn setup(
    overdraft: usize,
) -> (
    NetworkEnvironment,
    Arc<creditflow_core::ResultPartition>,
    creditflow_core::gate::InputGate,
) {
    let env = NetworkEnvironment::new(EnvConfig {
        memory: 20 * SEGMENT,
        segment_size: SEGMENT,
        local_handoff: false,
        overdraft_buffers: overdraft,
        ..EnvConfig::default()
    })
    .unwrap();
    let part = env.create_partition("p", 1).unwrap();
    let gate = env
        .create_input_gate(vec![ChannelSpec {
            address: env.address().into(),
            partition_id: "p".into(),
            subpartition: 0,
        }])
        .unwrap();
    assert_eq!(part.metrics().pool.share, 12);
    (env, part, gate)
}

/// One record of about 14 segments: more than the share (12), less than share + 5.
fn big_batch() -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
    let rows = 14 * SEGMENT / 8 - 64;
    RecordBatch::try_new(
        schema,
        vec![Arc::new(Int64Array::from_iter_values(0..rows as i64))],
    )
    .unwrap()
}

fn short_wait() -> Wait<'static> {
    Wait::timeout(Some(Duration::from_millis(300)), "test")
}

#[test]
fn a_record_larger_than_the_share_finishes_on_overdraft_while_nobody_reads() {
    let (_env, part, mut gate) = setup(5);
    let mut w = RecordWriter::new(part.clone(), Partitioner::Forward);
    let batch = big_batch();
    // Nobody reads yet: the pool is exhausted after 12 segments, the overdraft covers the rest.
    w.write(&batch, &mut short_wait()).unwrap();
    let m = part.metrics();
    assert!(
        m.pool.in_use > m.pool.share,
        "in use {} share {}",
        m.pool.in_use,
        m.pool.share
    );
    assert!(m.out_pool_usage() > 1.0, "usage {}", m.out_pool_usage());
    assert!(m.pool.in_use <= m.pool.share + 5);
    w.close().unwrap();
    // Everything arrives intact, and the borrowed segments go back once read.
    let got = gate.next(&mut short_wait()).unwrap().expect("the batch");
    assert_eq!(got, batch);
    assert!(gate.next(&mut short_wait()).unwrap().is_none());
    assert!(part.metrics().pool.in_use <= part.metrics().pool.share);
}

#[test]
fn without_overdraft_the_same_record_stalls_mid_record() {
    let (_env, part, _gate) = setup(0);
    let mut w = RecordWriter::new(part.clone(), Partitioner::Forward);
    let err = w.write(&big_batch(), &mut short_wait()).unwrap_err();
    assert!(matches!(err, Error::Timeout(..)), "{err}");
    // Half a record is in the stream: the partition failed rather than corrupt the stream.
    assert!(w.write(&big_batch(), &mut short_wait()).is_err());
}

#[test]
fn overdraft_is_not_taken_before_a_record_starts() {
    let (_env, part, _gate) = setup(5);
    let mut w = RecordWriter::new(part.clone(), Partitioner::Forward);
    // Fill the share with small records that nobody reads (each reserved whole up front).
    let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
    let small = RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from_iter_values(0..400))]).unwrap();
    let mut written = 0;
    while w.write(&small, &mut short_wait()).is_ok() {
        written += 1;
        assert!(written < 100, "the pool never ran out");
    }
    let m = part.metrics();
    // The writer blocked at a record boundary, within the share: no overdraft was used.
    assert!(
        m.pool.in_use <= m.pool.share,
        "in use {} share {}",
        m.pool.in_use,
        m.pool.share
    );
}
