//! The I/O thread of an attached task's process (`creditflow-attach`: a tokio runtime with one
//! worker, made when the first attachment needs it, never at import; a forked child makes its
//! own), the runtimes a caller's thread drives itself (a gate's: no thread of its own), and
//! how a blocking call waits on either.

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

/// A runtime of the caller's own, with no thread: whoever waits on it runs its I/O and timers
/// (the operating system wakes that thread itself, no other thread hands it over).
pub(crate) fn own() -> Result<Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::InvalidArgument(format!("cannot make a runtime for an attached gate: {e}")))
}

/// Runs `fut` to completion on `handle` from a thread outside it, as `wait` allows: its
/// deadline and interrupt check end the wait (and drop `fut`), nothing else does.
pub(crate) fn block_on<F: Future>(handle: &Handle, fut: F, wait: &mut Wait<'_>) -> Result<F::Output> {
    in_slices(handle, fut, wait)
}

/// [`block_on`] on a runtime the calling thread drives itself (made by [`own`]).
pub(crate) fn drive<F: Future>(rt: &Runtime, fut: F, wait: &mut Wait<'_>) -> Result<F::Output> {
    in_slices(rt, fut, wait)
}

/// What runs a future to completion on the calling thread.
trait Runs {
    fn run<G: Future>(&self, g: G) -> G::Output;
}

impl Runs for Handle {
    fn run<G: Future>(&self, g: G) -> G::Output {
        self.block_on(g)
    }
}

impl Runs for Runtime {
    fn run<G: Future>(&self, g: G) -> G::Output {
        self.block_on(g)
    }
}

/// Polls `fut` on `on` a slice of `wait` at a time, checking `wait` between slices.
fn in_slices<F: Future>(on: &impl Runs, fut: F, wait: &mut Wait<'_>) -> Result<F::Output> {
    let mut fut = std::pin::pin!(fut);
    loop {
        let slice = wait.tick()?;
        // The timer is made inside the runtime (the caller's thread is not in it).
        if let Ok(v) = on.run(async { tokio::time::timeout(slice, fut.as_mut()).await }) {
            return Ok(v);
        }
    }
}
