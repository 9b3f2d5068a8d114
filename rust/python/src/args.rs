//! Checks on arguments and on the calling process, shared by the classes.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Once;

use creditflow_core::partition::spill::SpillKind;
use creditflow_core::serde::Compression;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use crate::error::IntoPyResult;

/// A non-negative count; a negative one is a `ValueError` (not pyo3's `OverflowError`).
pub(crate) fn count_arg(value: i64, name: &str) -> PyResult<usize> {
    usize::try_from(value).map_err(|_| PyValueError::new_err(format!("{name} must be >= 0, got {value}")))
}

/// `create_partition`'s `kind`, `replay` and `compression`: the spillable kind (`None`:
/// pipelined) and the codec; `ValueError` for a combination no partition has.
pub(crate) fn partition_kind(
    py: Python<'_>,
    kind: &str,
    replay: bool,
    compression: Option<&str>,
) -> PyResult<(Option<SpillKind>, Option<Compression>)> {
    let compression = Compression::parse(compression).py_err(py)?;
    let spill = match (kind, replay) {
        ("pipelined", false) => None,
        ("blocking", _) => Some(SpillKind::Blocking),
        ("hybrid", replay) => Some(SpillKind::Hybrid { replay }),
        ("pipelined", true) => return Err(PyValueError::new_err(
            "replay=True needs kind=\"hybrid\" (a blocking partition always replays; a pipelined one cannot)",
        )),
        (other, _) => {
            return Err(PyValueError::new_err(format!(
                "kind must be \"pipelined\", \"blocking\" or \"hybrid\", got {other:?}"
            )))
        }
    };
    if spill.is_none() && compression.is_some() {
        return Err(PyValueError::new_err(
            "compression applies to what a blocking or hybrid partition stores; a pipelined partition stores nothing",
        ));
    }
    Ok((spill, compression))
}

/// This process's id, kept in memory (`getpid` is a system call, and the check below runs on
/// every call of every object): read once, and again in a child after every `fork` (a
/// `pthread_atfork` handler registered on first use, so also after forks made from C).
pub(crate) fn current_pid() -> u32 {
    static REGISTERED: Once = Once::new();
    REGISTERED.call_once(|| {
        extern "C" fn in_child() {
            PID.store(std::process::id(), Ordering::Relaxed);
        }
        PID.store(std::process::id(), Ordering::Relaxed);
        // SAFETY: the handler only stores the child's pid in an atomic (async-signal-safe work).
        let rc = unsafe { libc::pthread_atfork(None, None, Some(in_child)) };
        if rc != 0 {
            // Without the handler a forked child could not tell: fall back to asking each time.
            PID.store(0, Ordering::Relaxed);
        }
    });
    match PID.load(Ordering::Relaxed) {
        0 => std::process::id(),
        pid => pid,
    }
}

/// The cached pid (0: not registered, ask the kernel).
static PID: AtomicU32 = AtomicU32::new(0);

/// Fails if used in a process other than the one that created the object (after fork).
pub(crate) fn check_pid(pid: u32, what: &str) -> PyResult<()> {
    let now = current_pid();
    if now != pid {
        return Err(PyRuntimeError::new_err(format!(
            "this {what} was created in process {pid} and cannot be used in process {now} (after fork); \
             create a new NetworkEnvironment in this process"
        )));
    }
    Ok(())
}
