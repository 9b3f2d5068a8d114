//! `creditflow._native`: thin pyo3 bindings over `creditflow-core`.
//!
//! | file | what |
//! |---|---|
//! | `error.rs` | core errors → the exception classes `creditflow.errors` registers |
//! | `args.rs` | argument and calling-process checks shared by the classes |
//! | `blocking.rs` | GIL release, Ctrl-C, timeouts for blocking calls |
//! | `metrics.rs` | metrics snapshots → dicts keyed by the Rust field names |
//! | `partition.rs` | `ResultPartition` |
//! | `env.rs` | `NetworkEnvironment` |
//! | `host.rs` | `HostService`, `Attachment`, `attach()` |
//! | `logs.rs` | Rust `log` records → a queue → Python `logging` (`creditflow.logs`) |
//! | `writer.rs` | `RecordWriter` |
//! | `gate.rs` | `InputGate`, `GateItems` |
//! | `items.rs` | what `InputGate.items()` yields: `Batch`, `Event`, `Barrier`, `CheckpointAborted` |
//! | `spec.rs` | `ChannelSpec` |
//! | `partitioners.rs` | `HashPartitioner`, `RoundRobinPartitioner`, `BroadcastPartitioner`, `ForwardPartitioner` |
//! | `arrow_in.rs` | Arrow data in from Python (the C data interface, the schema imported once) |
//! | `arrow_out.rs` | batches out to Python as `pyarrow.RecordBatch` |
//! | `tls.rs` | `TLSConfig` |
//! | `settings.rs` | `settings()`: the core's table of environment settings |
//!
//! The module imports nothing from the `creditflow` package: Python drives it (the package
//! registers its exception classes, starts log forwarding and `/metrics` servers).

mod args;
mod arrow_in;
mod arrow_out;
mod blocking;
mod config;
mod env;
mod error;
mod gate;
mod host;
mod items;
mod logs;
mod metrics;
mod partition;
mod partitioners;
mod settings;
mod shuffle;
mod spec;
mod tls;
mod writer;

use pyo3::prelude::*;

/// The compiled core of creditflow. Use the `creditflow` package, not this module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<env::NetworkEnvironment>()?;
    m.add_class::<host::HostService>()?;
    m.add_class::<host::Attachment>()?;
    m.add_function(wrap_pyfunction!(host::attach, m)?)?;
    m.add_class::<env::MemoryReservation>()?;
    m.add_class::<partition::ResultPartition>()?;
    m.add_class::<writer::RecordWriter>()?;
    m.add_class::<gate::InputGate>()?;
    m.add_class::<spec::ChannelSpec>()?;
    m.add_class::<items::Batch>()?;
    m.add_class::<items::Event>()?;
    m.add_class::<items::Barrier>()?;
    m.add_class::<items::CheckpointAborted>()?;
    m.add_class::<gate::GateItems>()?;
    m.add_class::<tls::TlsConfig>()?;
    m.add_class::<partitioners::HashPartitioner>()?;
    m.add_class::<partitioners::RoundRobinPartitioner>()?;
    m.add_class::<partitioners::BroadcastPartitioner>()?;
    m.add_class::<partitioners::ForwardPartitioner>()?;
    m.add_class::<settings::Setting>()?;
    m.add_function(wrap_pyfunction!(settings::settings, m)?)?;
    m.add_function(wrap_pyfunction!(error::_register_errors, m)?)?;
    m.add_function(wrap_pyfunction!(env::parse_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(shuffle::_permutation, m)?)?;
    m.add_function(wrap_pyfunction!(env::_remove_spill_dirs, m)?)?;
    m.add_function(wrap_pyfunction!(logs::_drain_logs, m)?)?;
    m.add_function(wrap_pyfunction!(logs::_set_log_level, m)?)?;
    m.add_function(wrap_pyfunction!(logs::_wake_logs, m)?)?;
    logs::install();
    Ok(())
}
