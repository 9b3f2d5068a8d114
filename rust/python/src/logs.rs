//! Rust `log` records → Python `logging`, without touching the GIL where they are made.
//!
//! Records are made on the tokio I/O thread and on writer/reader threads, sometimes with a
//! core lock held. Taking the GIL there could deadlock against a Python thread that holds
//! the GIL and waits for that lock (e.g. in `env.metrics()`), and fails at interpreter
//! shutdown. So [`QueueLogger`] only formats the record into a bounded queue; a Python
//! daemon thread (`creditflow.logs`, started with the first environment) takes them out
//! with [`drain_logs`] (GIL released while it waits) and emits them with `logging`.
//! Loggers are named after the Rust layer and room under `creditflow.` (`creditflow.net.server`).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use pyo3::prelude::*;

/// Records kept when Python does not drain them; older ones are dropped (and counted).
const CAPACITY: usize = 10_000;

struct Queue {
    records: Mutex<VecDeque<(u8, String, String)>>,
    cv: Condvar,
    dropped: AtomicU64,
    /// Set by [`_wake_logs`]: a waiting [`_drain_logs`] returns at once.
    wake: AtomicBool,
}

static QUEUE: Queue = Queue {
    records: Mutex::new(VecDeque::new()),
    cv: Condvar::new(),
    dropped: AtomicU64::new(0),
    wake: AtomicBool::new(false),
};

struct QueueLogger;

static LOGGER: QueueLogger = QueueLogger;

/// Python `logging` level of a Rust level.
fn python_level(level: log::Level) -> u8 {
    match level {
        log::Level::Error => 40,
        log::Level::Warn => 30,
        log::Level::Info => 20,
        log::Level::Debug => 10,
        log::Level::Trace => 5,
    }
}

/// A logger per room, not per file: `creditflow_core::net::server::serve` →
/// `creditflow.net.server`, `creditflow_core::net::runtime` → `creditflow.net`,
/// `creditflow_core::env` → `creditflow.env`. The crate becomes `creditflow` and the last
/// module (the file) is dropped below a layer, so splitting a file renames no logger.
fn logger_name(target: &str) -> String {
    let mut parts = target.split("::");
    let _crate = parts.next();
    let mut rest: Vec<&str> = parts.collect();
    if rest.len() > 1 {
        rest.pop();
    }
    if rest.is_empty() {
        "creditflow".to_string()
    } else {
        format!("creditflow.{}", rest.join("."))
    }
}

impl log::Log for QueueLogger {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::max_level() && metadata.target().starts_with("creditflow")
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let msg = record.args().to_string();
        let msg = msg
            .strip_prefix("creditflow: ")
            .map(str::to_string)
            .unwrap_or(msg);
        let entry = (python_level(record.level()), logger_name(record.target()), msg);
        let Ok(mut q) = QUEUE.records.lock() else { return };
        if q.len() >= CAPACITY {
            q.pop_front();
            QUEUE.dropped.fetch_add(1, Ordering::Relaxed);
        }
        q.push_back(entry);
        drop(q);
        QUEUE.cv.notify_one();
    }

    fn flush(&self) {}
}

/// Installs the queue logger (once per process; a logger installed before wins).
pub(crate) fn install() {
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(log::LevelFilter::Warn);
    }
}

/// Takes the queued records as `(level, logger name, message)`, waiting up to `timeout`
/// seconds (GIL released) for the first one. Also returns how many were dropped since the
/// last call because the queue was full.
#[pyfunction]
#[pyo3(signature = (timeout = 0.0))]
pub(crate) fn _drain_logs(py: Python<'_>, timeout: f64) -> (Vec<(u8, String, String)>, u64) {
    let wait = if timeout.is_finite() && timeout > 0.0 {
        Duration::from_secs_f64(timeout.min(3600.0))
    } else {
        Duration::ZERO
    };
    let records = py.detach(|| {
        let Ok(mut q) = QUEUE.records.lock() else {
            return Vec::new();
        };
        if q.is_empty() && !wait.is_zero() {
            q = match QUEUE
                .cv
                .wait_timeout_while(q, wait, |q| q.is_empty() && !QUEUE.wake.load(Ordering::SeqCst))
            {
                Ok((q, _)) => q,
                Err(_) => return Vec::new(),
            };
        }
        QUEUE.wake.store(false, Ordering::SeqCst);
        q.drain(..).collect()
    });
    (records, QUEUE.dropped.swap(0, Ordering::Relaxed))
}

/// Makes a waiting [`_drain_logs`] return now (to stop the forwarding thread).
#[pyfunction]
pub(crate) fn _wake_logs() {
    let _q = QUEUE.records.lock();
    QUEUE.wake.store(true, Ordering::SeqCst);
    QUEUE.cv.notify_all();
}

/// Makes Rust produce records at Python `level` and above (a `logging` level number).
#[pyfunction]
pub(crate) fn _set_log_level(level: i64) {
    let filter = match level {
        l if l <= 5 => log::LevelFilter::Trace,
        l if l <= 10 => log::LevelFilter::Debug,
        l if l <= 20 => log::LevelFilter::Info,
        l if l <= 30 => log::LevelFilter::Warn,
        l if l <= 40 => log::LevelFilter::Error,
        _ => log::LevelFilter::Off,
    };
    log::set_max_level(filter);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_loggers_under_creditflow() {
        assert_eq!(
            logger_name("creditflow_core::net::server::serve"),
            "creditflow.net.server"
        );
        assert_eq!(logger_name("creditflow_core::net::runtime"), "creditflow.net");
        assert_eq!(logger_name("creditflow_core::env"), "creditflow.env");
        assert_eq!(logger_name("creditflow_core"), "creditflow");
    }
}
