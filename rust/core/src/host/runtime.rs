//! The I/O thread of an attached task's process (`creditflow-attach`: a tokio runtime with one
//! worker, made when the first attachment needs it, never at import; a forked child makes its
//! own), and how a blocking call waits on it.

use std::future::Future;
use std::sync::Mutex;

use tokio::runtime::{Handle, Runtime};

use crate::base::error::{Error, Result};
use crate::base::wait::Wait;

/// This process's runtime, with the pid that made it (a forked child's is not its own).
static RUNTIME: Mutex<Option<(u32, Runtime)>> = Mutex::new(None);

/// The attach runtime of this process, started on first use.
pub(crate) fn handle() -> Result<Handle> {
    let pid = std::process::id();
    let mut rt = RUNTIME.lock().unwrap();
    if let Some((owner, r)) = rt.as_ref() {
        if *owner == pid {
            return Ok(r.handle().clone());
        }
    }
    if let Some((_, inherited)) = rt.take() {
        // The parent's threads are not in this process: dropping would wait for them.
        std::mem::forget(inherited);
    }
    let r = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("creditflow-attach")
        .enable_all()
        .build()
        .map_err(|e| Error::InvalidArgument(format!("cannot start the attach I/O thread: {e}")))?;
    let h = r.handle().clone();
    *rt = Some((pid, r));
    Ok(h)
}

/// Runs `fut` to completion on `handle` from a thread outside it, as `wait` allows: its
/// deadline and interrupt check end the wait (and drop `fut`), nothing else does.
pub(crate) fn block_on<F: Future>(handle: &Handle, fut: F, wait: &mut Wait<'_>) -> Result<F::Output> {
    let mut fut = std::pin::pin!(fut);
    loop {
        let slice = wait.tick()?;
        // The timer is made inside the runtime (the caller's thread is not in it).
        if let Ok(v) = handle.block_on(async { tokio::time::timeout(slice, fut.as_mut()).await }) {
            return Ok(v);
        }
    }
}
