//! Synchronisation primitives, swapped for loom's under `--cfg loom` so the lock-free
//! parts can be model-checked (`RUSTFLAGS="--cfg loom" cargo test -p creditflow-core --release loom`).

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::{Condvar, Mutex};
// Arc stays std's under loom (loom's cannot be a method receiver); it guards no data race.
#[cfg(loom)]
pub(crate) use std::sync::Arc;

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::{Arc, Condvar, Mutex};

/// The subpartition queue: crossbeam's lock-free `SegQueue`; under loom, a mutex-protected
/// deque with the same (linearizable) behaviour, so loom can explore the wake-up protocol
/// around it without spinning inside uninstrumented code.
#[cfg(not(loom))]
pub(crate) type Queue<T> = crossbeam_queue::SegQueue<T>;

#[cfg(loom)]
pub(crate) struct Queue<T>(Mutex<std::collections::VecDeque<T>>);

#[cfg(loom)]
impl<T> Queue<T> {
    pub(crate) fn new() -> Self {
        Queue(Mutex::new(std::collections::VecDeque::new()))
    }

    pub(crate) fn push(&self, value: T) {
        self.0.lock().unwrap().push_back(value);
    }

    pub(crate) fn pop(&self) -> Option<T> {
        self.0.lock().unwrap().pop_front()
    }
}
