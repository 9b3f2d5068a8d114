//! Record bytes (protocol version 3) in memory: many senders ([`SenderCredit`]'s record side)
//! against one gate's [`RecordBudget`] over one connection (two FIFO wires), a consumer
//! taking records in arrival order. After every step: the gate's record bytes (held +
//! granted) stay under its budget plus the largest record. In the end, with every side run
//! to quiescence, every record is delivered in order (no deadlock, also when every record is
//! larger than the whole budget). Driven by the property test in `protocol/credit` and by the
//! `credit` fuzz target (after the credit scenario, from the same bytes).

use std::collections::VecDeque;

use super::Bytes;
use crate::protocol::credit::{ChannelId, Credit, RecordBudget, SenderCredit};

/// Many senders, one gate, one connection (two FIFO wires), a consumer taking records in
/// arrival order; records of one buffer each.
pub struct Model {
    gate: RecordBudget,
    senders: Vec<(SenderCredit, VecDeque<u64>)>,
    to_receiver: VecDeque<(usize, bool, u64)>,
    to_sender: VecDeque<(usize, u64)>,
    consumer: VecDeque<(usize, u64)>,
    delivered: Vec<Vec<u64>>,
    largest: u64,
}

impl Model {
    pub fn new(budget: u64, records: Vec<Vec<u64>>) -> Model {
        let mut gate = RecordBudget::new(budget);
        let largest = records.iter().flatten().copied().max().unwrap_or(0);
        let senders = records
            .into_iter()
            .map(|r| {
                gate.add_channel();
                (SenderCredit::new(Credit::new(1)), VecDeque::from(r))
            })
            .collect::<Vec<_>>();
        let n = senders.len();
        Model {
            gate,
            senders,
            to_receiver: VecDeque::new(),
            to_sender: VecDeque::new(),
            consumer: VecDeque::new(),
            delivered: vec![Vec::new(); n],
            largest,
        }
    }

    /// One step of kind `op` (on `channel` where it matters); whether anything happened.
    pub fn step(&mut self, op: u8, channel: usize) -> bool {
        let moved = match op % 4 {
            0 => {
                let c = channel % self.senders.len();
                let (sender, queue) = &mut self.senders[c];
                let Some(&size) = queue.front() else { return false };
                if sender.can_start_records(size) {
                    sender.on_records_started(size).unwrap();
                    queue.pop_front();
                    self.to_receiver.push_back((c, true, size));
                    true
                } else if sender.needs_record_announcement(size) {
                    sender.on_record_announced(size);
                    self.to_receiver.push_back((c, false, size));
                    true
                } else {
                    false
                }
            }
            1 => match self.to_receiver.pop_front() {
                Some((c, true, size)) => {
                    self.gate.on_records_started(ChannelId(c), size).unwrap();
                    self.consumer.push_back((c, size));
                    true
                }
                Some((c, false, size)) => {
                    self.gate.on_record_announcement(ChannelId(c), size).unwrap();
                    true
                }
                None => false,
            },
            2 => match self.to_sender.pop_front() {
                Some((c, bytes)) => {
                    self.senders[c].0.on_record_grant(bytes).unwrap();
                    true
                }
                None => false,
            },
            _ => match self.consumer.pop_front() {
                Some((c, size)) => {
                    self.gate.on_records_taken(ChannelId(c), size);
                    self.delivered[c].push(size);
                    true
                }
                None => false,
            },
        };
        while let Some((c, bytes)) = self.gate.poll_grant() {
            self.to_sender.push_back((c.0, bytes));
        }
        // The bound: held + granted never exceeds the budget by more than one record.
        let reserved = self.gate.held() + self.gate.granted();
        assert!(
            reserved < self.gate.budget() + self.largest.max(1),
            "reserved {reserved} beyond budget {} + largest record {}",
            self.gate.budget(),
            self.largest
        );
        moved
    }
}

impl Model {
    /// Runs every side round robin until nothing moves.
    pub fn drain(&mut self) {
        loop {
            let mut moved = false;
            for op in 0..4u8 {
                for c in 0..self.senders.len() {
                    moved |= self.step(op, c);
                }
            }
            if !moved {
                break;
            }
        }
    }

    /// Every record delivered in order; each sender's unused grant is what the gate counts
    /// for its channel (grants ahead included), and once the channels end (are released)
    /// nothing is held or granted.
    pub fn assert_all_delivered(&mut self, records: &[Vec<u64>]) {
        assert_eq!(self.delivered, records, "every record delivered, in order");
        for (c, (sender, _)) in self.senders.iter().enumerate() {
            let stats = self.gate.channel_stats(ChannelId(c)).unwrap();
            assert_eq!(sender.record_granted(), stats.granted, "channel {c}'s grant");
        }
        for c in 0..self.senders.len() {
            self.gate.release_channel(ChannelId(c));
        }
        assert_eq!((self.gate.held(), self.gate.granted()), (0, 0));
    }
}

/// Runs one scenario: a byte for the budget (1–64), one for the number of channels (1–5),
/// per channel a byte for its number of records (0–5) and a byte per record (its size, 1–48,
/// plus the budget when the scenario's top bit says every record exceeds it), then steps (two
/// bytes each); the bound after every step, then everything must be delivered.
pub fn run(data: &[u8]) {
    let mut input = Bytes::new(data);
    let budget = u64::from(input.u8().unwrap_or(0) % 64) + 1;
    let first = input.u8().unwrap_or(0);
    let huge = first & 0x80 != 0;
    let channels = usize::from(first % 5) + 1;
    let records: Vec<Vec<u64>> = (0..channels)
        .map(|_| {
            let n = input.u8().unwrap_or(0) % 6;
            (0..n)
                .map(|_| u64::from(input.u8().unwrap_or(0) % 48) + 1 + if huge { budget } else { 0 })
                .collect()
        })
        .collect();
    let mut m = Model::new(budget, records.clone());
    for _ in 0..4096 {
        let (Some(op), Some(c)) = (input.u8(), input.u8()) else {
            break;
        };
        m.step(op, usize::from(c));
    }
    m.drain();
    m.assert_all_delivered(&records);
}
