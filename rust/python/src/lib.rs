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
//! | `io.rs` | `RecordWriter`, `InputGate`, `ChannelSpec`, partitioners, Arrow in/out |
//! | `tls.rs` | `TLSConfig` |
//! | `settings.rs` | `settings()`: the core's table of environment settings |
//!
//! The module imports nothing from the `creditflow` package: Python drives it (the package
//! registers its exception classes, starts log forwarding and `/metrics` servers).

mod args;
mod arrow_in;
mod blocking;
mod env;
mod error;
mod host;
mod io;
mod logs;
mod metrics;
mod partition;
mod settings;
mod tls;

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
    m.add_class::<io::RecordWriter>()?;
    m.add_class::<io::InputGate>()?;
    m.add_class::<io::ChannelSpec>()?;
    m.add_class::<io::Batch>()?;
    m.add_class::<io::Event>()?;
    m.add_class::<io::Barrier>()?;
    m.add_class::<io::CheckpointAborted>()?;
    m.add_class::<io::GateItems>()?;
    m.add_class::<tls::TlsConfig>()?;
    m.add_class::<io::HashPartitioner>()?;
    m.add_class::<io::RoundRobinPartitioner>()?;
    m.add_class::<io::BroadcastPartitioner>()?;
    m.add_class::<io::ForwardPartitioner>()?;
    m.add_class::<settings::Setting>()?;
    m.add_function(wrap_pyfunction!(settings::settings, m)?)?;
    m.add_function(wrap_pyfunction!(error::_register_errors, m)?)?;
    m.add_function(wrap_pyfunction!(env::parse_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(env::_remove_spill_dirs, m)?)?;
    m.add_function(wrap_pyfunction!(logs::_drain_logs, m)?)?;
    m.add_function(wrap_pyfunction!(logs::_set_log_level, m)?)?;
    m.add_function(wrap_pyfunction!(logs::_wake_logs, m)?)?;
    logs::install();
    Ok(())
}
