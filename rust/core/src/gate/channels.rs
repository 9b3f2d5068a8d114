//! A gate's channels: what each one reads ([`ChannelState`]: pending, local, remote, ended),
//! the wake-up queue the subpartitions' listeners push ready channels into ([`Ready`]), and
//! what is held between polling a channel and yielding ([`Queued`]).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::base::config::ChannelSpec;
use crate::net::{Inbound, RemoteChannel};
use crate::partition::subpartition::{Subpartition, Token};
use crate::partition::{Handed, ResultPartition};
use crate::serde::RecordDeserializer;

/// What the gate holds between polling a channel and yielding (keeps per-channel order).
pub(super) enum Queued {
    /// A batch; for a remote channel, the record bytes it holds in the gate's record budget
    /// (released when it is yielded).
    Batch(usize, Handed, Option<Token>, Option<crate::net::RecordBytes>),
    Event(usize, Vec<u8>),
    Barrier {
        id: u64,
        unaligned: bool,
    },
    Aborted(u64),
    /// Where the producer wrote unaligned barrier `id` on a channel (not yielded).
    Position(usize, u64),
    /// A channel ended (not yielded).
    Ended(usize),
}

/// Wake-up side of the gate, shared with the subpartitions' listeners.
pub(super) struct Ready {
    pub(super) queue: Mutex<VecDeque<usize>>,
    pub(super) cv: Condvar,
    pub(super) queued: Vec<AtomicBool>,
    /// The reader sleeps on `cv`; written only with `queue` locked, so a pusher that holds
    /// the lock sees it exactly (and skips the futex wake when nobody sleeps).
    pub(super) sleeping: AtomicBool,
    /// Told after a channel becomes ready, for a reader that polls the gate
    /// ([`super::InputGate::set_ready_listener`]) instead of sleeping on `cv`.
    pub(super) listener: OnceLock<ReadyListener>,
}

/// What a polling reader is told when a channel of its gate becomes ready (from any thread:
/// it must be quick and must not call into the gate).
pub type ReadyListener = Arc<dyn Fn() + Send + Sync>;

impl Ready {
    pub(super) fn push(&self, idx: usize) {
        if !self.queued[idx].swap(true, Ordering::SeqCst) {
            let mut q = self.queue.lock().unwrap();
            q.push_back(idx);
            let sleeping = self.sleeping.load(Ordering::SeqCst);
            drop(q);
            if sleeping {
                self.cv.notify_one();
            }
            if let Some(listener) = self.listener.get() {
                listener();
            }
        }
    }
}

pub(super) enum ChannelState {
    /// Waiting for the partition to be registered.
    Pending { next_try: Instant, delay: Duration },
    /// Reading a local subpartition.
    Local {
        partition: Arc<ResultPartition>,
        sub: Arc<Subpartition>,
        de: RecordDeserializer,
    },
    /// Reading a subpartition of another environment over TCP.
    Remote {
        ch: Arc<RemoteChannel>,
        de: RecordDeserializer,
        /// Items received after an aligned barrier that blocked the channel.
        held: VecDeque<Inbound>,
    },
    /// End-of-partition seen (or the gate was closed).
    Ended,
}

pub(super) struct Channel {
    pub(super) spec: ChannelSpec,
    pub(super) state: ChannelState,
}
