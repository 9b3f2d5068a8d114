//! [`ReadyQueue`] against a reference model (a `VecDeque` searched linearly) under an
//! arbitrary sequence of enqueue, dequeue, remove and contains over a few keys.

use std::collections::VecDeque;

use super::Bytes;
use crate::protocol::credit::ReadyQueue;

/// Most operations one scenario runs.
const MAX_OPS: usize = 8192;

/// Runs one scenario: each byte is an operation (low 2 bits) on a key (the rest, mod 16).
/// The queue must answer exactly as the model, hold each key at most once and serve in
/// first-in, first-out order.
pub fn run(data: &[u8]) {
    let mut input = Bytes::new(data);
    let mut queue = ReadyQueue::new();
    let mut model: VecDeque<u8> = VecDeque::new();
    for _ in 0..MAX_OPS {
        let Some(b) = input.u8() else { break };
        let key = (b >> 2) % 16;
        match b & 3 {
            0 => {
                let fresh = !model.contains(&key);
                if fresh {
                    model.push_back(key);
                }
                assert_eq!(queue.enqueue(key), fresh, "enqueue({key})");
            }
            1 => assert_eq!(queue.dequeue(), model.pop_front(), "dequeue"),
            2 => {
                let at = model.iter().position(|k| *k == key);
                if let Some(i) = at {
                    model.remove(i);
                }
                assert_eq!(queue.remove(key), at.is_some(), "remove({key})");
            }
            _ => assert_eq!(queue.contains(key), model.contains(&key), "contains({key})"),
        }
        assert_eq!(queue.len(), model.len());
        assert_eq!(queue.is_empty(), model.is_empty());
    }
    // Everything left comes out in order, once.
    while let Some(k) = model.pop_front() {
        assert_eq!(queue.dequeue(), Some(k));
    }
    assert_eq!(queue.dequeue(), None);
}
