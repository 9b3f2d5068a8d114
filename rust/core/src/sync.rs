//! Synchronisation primitives, swapped for loom's under `--cfg loom` so the lock-free
//! parts can be model-checked (`RUSTFLAGS="--cfg loom" cargo test -p creditflow-core --release loom`).

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::{Arc, Condvar, Mutex};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::{Arc, Condvar, Mutex};
