//! [`ReadyQueue`]: the readers of one connection that have something to send (Flink's
//! `PartitionRequestQueue#availableReaders`).

use std::collections::{HashSet, VecDeque};
use std::hash::Hash;

/// Readers with something to send, each at most once, served round robin (Flink:
/// `PartitionRequestQueue#availableReaders`). `K` is whatever identifies a reader.
#[derive(Clone, Debug)]
pub struct ReadyQueue<K> {
    order: VecDeque<K>,
    queued: HashSet<K>,
}

impl<K> Default for ReadyQueue<K> {
    fn default() -> Self {
        ReadyQueue {
            order: VecDeque::new(),
            queued: HashSet::new(),
        }
    }
}

impl<K: Copy + Eq + Hash> ReadyQueue<K> {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends `reader` unless it is already queued; returns whether it was added.
    pub fn enqueue(&mut self, reader: K) -> bool {
        let added = self.queued.insert(reader);
        if added {
            self.order.push_back(reader);
        }
        added
    }

    /// Takes the reader that has waited longest. Put it back with [`ReadyQueue::enqueue`]
    /// after writing one buffer if it is still available: that is the round robin.
    pub fn dequeue(&mut self) -> Option<K> {
        let reader = self.order.pop_front()?;
        self.queued.remove(&reader);
        Some(reader)
    }

    /// Drops `reader` (cancelled or released); returns whether it was queued.
    pub fn remove(&mut self, reader: K) -> bool {
        let removed = self.queued.remove(&reader);
        if removed {
            self.order.retain(|r| *r != reader);
        }
        removed
    }

    /// Whether `reader` is queued.
    pub fn contains(&self, reader: K) -> bool {
        self.queued.contains(&reader)
    }

    /// Number of queued readers.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether no reader is queued.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}
