//! What several integration tests make the same way: an environment, batches of one `Int64`
//! key column that carry their write stamp, the spec of a channel to a subpartition, a
//! bounded wait, and a counting allocator ([`alloc`]).

// Each test crate that includes this module uses some of it.
#![allow(dead_code)]

pub mod alloc;

use std::sync::Arc;
use std::time::Duration;

use arrow_array::{Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use creditflow_core::base::config::ChannelSpec;
use creditflow_core::base::wait::Wait;
use creditflow_core::env::{EnvConfig, NetworkEnvironment};

/// An environment of 8 MiB, with `cfg` applied.
pub fn env(cfg: impl FnOnce(&mut EnvConfig)) -> NetworkEnvironment {
    let mut c = EnvConfig {
        memory: 8 << 20,
        ..EnvConfig::default()
    };
    cfg(&mut c);
    NetworkEnvironment::new(c).unwrap()
}

/// A batch of `rows` keys `start ..` (column `k`, not nullable).
pub fn keys(start: i64, rows: usize) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
    let k = Int64Array::from_iter_values(start..start + rows as i64);
    RecordBatch::try_new(schema, vec![Arc::new(k)]).unwrap()
}

/// Batch `t` of `rows` rows: keys `t * rows ..`, so that [`stamp`] gives `t` back.
pub fn stamped(t: usize, rows: usize) -> RecordBatch {
    keys((t * rows) as i64, rows)
}

/// The write stamp of a batch made by [`stamped`].
pub fn stamp(b: &RecordBatch) -> usize {
    let k = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
    k.value(0) as usize / b.num_rows()
}

/// The channel to subpartition `sub` of `producer`'s partition `id`.
pub fn spec(producer: &NetworkEnvironment, id: &str, sub: usize) -> ChannelSpec {
    ChannelSpec {
        address: producer.address().into(),
        partition_id: id.into(),
        subpartition: sub,
    }
}

/// A wait of at most `secs` seconds (a test that waits longer has failed).
pub fn wait(secs: u64) -> Wait<'static> {
    Wait::timeout(Some(Duration::from_secs(secs)), "test")
}
