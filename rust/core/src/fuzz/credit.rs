//! A sender and a receiver of [`crate::protocol::credit`] connected in memory (the sender loop with its
//! readers and ready queue, two wires, the gate's credit and the transport's AddCredit
//! queue, a consumer holding received buffers), driven by a sequence of operations, with the
//! invariants of the credit module checked after every step. The property test in
//! `protocol/credit/tests.rs` draws the operations with proptest, the `credit` fuzz target from bytes.

use std::collections::VecDeque;

use super::Bytes;
use crate::protocol::credit::{
    BufferHeader, BufferLease, ChannelCreditStats, ChannelId, Credit, DataType, Delivery, GateCredit,
    GateCreditConfig, QueueHead, ReadyQueue, ReceiverAction, SenderCredit,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Item {
    /// A data buffer: its id, how many buffers of its record follow it (0: it ends it), and
    /// whether the sender sends it as a record body buffer (not its record's first buffer,
    /// which carries the length prefix, nor its last: no credit needed).
    Data(u64, u32, bool),
    Event,
}

enum ToReceiver {
    Buffer {
        channel: usize,
        header: BufferHeader,
        item: Item,
    },
    Backlog {
        channel: usize,
        backlog: u32,
    },
}

struct Reader {
    credit: SenderCredit,
    queue: VecDeque<Item>,
    cancelled: bool,
}

impl Reader {
    fn head(&self) -> QueueHead {
        match self.queue.front() {
            None => QueueHead::Empty,
            Some(Item::Data(_, _, true)) => QueueHead::RecordBody,
            Some(Item::Data(..)) => QueueHead::Data,
            Some(Item::Event) => QueueHead::Event,
        }
    }

    fn backlog(&self) -> u32 {
        self.queue.iter().filter(|i| matches!(i, Item::Data(..))).count() as u32
    }
}

/// One connection: the sender loop (readers + ready queue), two wires, the receiver
/// (gate + the transport's AddCredit queue) and a consumer holding received buffers.
pub struct Pair {
    gate: GateCredit,
    readers: Vec<Reader>,
    ready: ReadyQueue<usize>,
    to_receiver: VecDeque<ToReceiver>,
    to_sender: VecDeque<(usize, Credit)>,
    add_credit_queue: VecDeque<ChannelId>,
    held: Vec<BufferLease>,
    produced: Vec<Vec<Item>>,
    delivered: Vec<Vec<Item>>,
    credit_announced: Vec<u64>,
    credit_received: Vec<u64>,
    /// Per channel, the buffers of the record in progress still to come at the receiver (0:
    /// between records), as the transport's record assembler knows them.
    record_left: Vec<u32>,
    next_id: u64,
}

/// One step of the scenario.
#[derive(Clone, Debug)]
pub enum Op {
    /// The producer queues a data buffer on a channel (a record of one buffer).
    Produce(usize),
    /// The producer queues a record spanning 2 + `n % 5` buffers on a channel.
    ProduceRecord(usize, usize),
    /// The producer queues an event (end of partition) on a channel.
    ProduceEvent(usize),
    /// The sender loop writes the next ready reader's buffer.
    SenderWrite,
    /// The next message to the receiver arrives.
    DeliverToReceiver,
    /// The receiver writes the next queued AddCredit.
    ReceiverWriteAddCredit,
    /// The next AddCredit arrives at the sender.
    DeliverToSender,
    /// The consumer recycles one of the buffers it holds.
    Recycle(usize),
    /// The consumer releases a channel (and cancels its request).
    Release(usize),
}

impl Pair {
    fn stats(&self, channel: ChannelId) -> ChannelCreditStats {
        self.gate.channel_stats(channel).expect("a channel of the gate")
    }

    /// `channels` channels of one gate with `config`.
    pub fn new(channels: usize, config: GateCreditConfig) -> Self {
        let mut gate = GateCredit::new(config).unwrap();
        let readers = (0..channels)
            .map(|i| {
                assert_eq!(gate.add_channel(), ChannelId(i));
                Reader {
                    credit: SenderCredit::new(gate.initial_credit()),
                    queue: VecDeque::new(),
                    cancelled: false,
                }
            })
            .collect();
        Pair {
            gate,
            readers,
            ready: ReadyQueue::new(),
            to_receiver: VecDeque::new(),
            to_sender: VecDeque::new(),
            add_credit_queue: VecDeque::new(),
            held: Vec::new(),
            produced: vec![Vec::new(); channels],
            delivered: vec![Vec::new(); channels],
            credit_announced: vec![0; channels],
            credit_received: vec![0; channels],
            record_left: vec![0; channels],
            next_id: 0,
        }
    }

    /// The sender loop looks at a reader whose state may have changed.
    fn schedule(&mut self, channel: usize) {
        let reader = &mut self.readers[channel];
        if reader.cancelled {
            return;
        }
        let backlog = reader.backlog();
        if reader.credit.is_available(reader.head()) {
            self.ready.enqueue(channel);
        } else if reader.credit.needs_backlog_announcement(backlog) {
            reader.credit.on_backlog_announced(backlog);
            self.to_receiver
                .push_back(ToReceiver::Backlog { channel, backlog });
        }
    }

    fn drain_receiver_actions(&mut self) {
        while let Some(ReceiverAction::SendAddCredit { channel }) = self.gate.poll_action() {
            self.add_credit_queue.push_back(channel);
        }
    }

    /// Applies one operation; returns whether anything happened.
    pub fn apply(&mut self, op: &Op) -> bool {
        match *op {
            Op::Produce(ch) | Op::ProduceEvent(ch) => {
                let ch = ch % self.readers.len();
                if self.readers[ch].cancelled {
                    return false;
                }
                let item = if matches!(op, Op::Produce(_)) {
                    self.next_id += 1;
                    Item::Data(self.next_id, 0, false)
                } else {
                    Item::Event
                };
                self.readers[ch].queue.push_back(item);
                self.produced[ch].push(item);
                self.schedule(ch);
            }
            Op::ProduceRecord(ch, n) => {
                let ch = ch % self.readers.len();
                if self.readers[ch].cancelled {
                    return false;
                }
                let buffers = 2 + (n % 5) as u32;
                for rest in (0..buffers).rev() {
                    self.next_id += 1;
                    let body = rest > 0 && rest < buffers - 1;
                    let item = Item::Data(self.next_id, rest, body);
                    self.readers[ch].queue.push_back(item);
                    self.produced[ch].push(item);
                }
                self.schedule(ch);
            }
            Op::SenderWrite => {
                let Some(ch) = self.ready.dequeue() else {
                    return false;
                };
                let reader = &mut self.readers[ch];
                if reader.cancelled || !reader.credit.is_available(reader.head()) {
                    return true;
                }
                let item = reader.queue.pop_front().unwrap();
                let backlog = reader.backlog();
                let header = match item {
                    Item::Data(_, _, true) => reader.credit.on_record_body_sent(backlog),
                    Item::Data(..) => reader.credit.on_buffer_sent(DataType::Data, backlog).unwrap(),
                    Item::Event => reader.credit.on_buffer_sent(DataType::Event, backlog).unwrap(),
                };
                self.to_receiver.push_back(ToReceiver::Buffer {
                    channel: ch,
                    header,
                    item,
                });
                self.schedule(ch);
            }
            Op::DeliverToReceiver => match self.to_receiver.pop_front() {
                None => return false,
                Some(ToReceiver::Buffer {
                    channel,
                    header,
                    item,
                }) => {
                    // As the transport: a data buffer inside the record in progress that does
                    // not end it is a record body buffer, by the receiver's own reckoning, which
                    // must agree with the sender's.
                    let (rest, body) = match item {
                        Item::Data(_, rest, body) => (Some(rest), body),
                        Item::Event => (None, false),
                    };
                    let inside = self.record_left[channel] > 0 && rest.is_some_and(|r| r > 0);
                    let id = ChannelId(channel);
                    let delivery = if inside {
                        self.gate.on_buffer_response_inside_record(id, header).unwrap()
                    } else {
                        self.gate.on_buffer_response(id, header).unwrap()
                    };
                    if let (Some(rest), false) = (rest, matches!(delivery, Delivery::Discarded)) {
                        assert_eq!(
                            inside, body,
                            "sender and receiver disagree on a record body buffer"
                        );
                        self.record_left[channel] = rest;
                    }
                    match delivery {
                        Delivery::Data(lease) => {
                            assert_eq!(lease.channel(), ChannelId(channel));
                            assert!(matches!(item, Item::Data(..)));
                            self.held.push(lease);
                            self.delivered[channel].push(item);
                        }
                        Delivery::Record => {
                            assert!(inside, "a buffer not inside a record landed in one");
                            self.delivered[channel].push(item);
                        }
                        Delivery::Event => {
                            assert_eq!(item, Item::Event);
                            self.delivered[channel].push(item);
                        }
                        Delivery::Discarded => assert!(self.stats(ChannelId(channel)).released),
                    }
                    self.drain_receiver_actions();
                }
                Some(ToReceiver::Backlog { channel, backlog }) => {
                    self.gate
                        .on_backlog_announcement(ChannelId(channel), backlog)
                        .unwrap();
                    self.drain_receiver_actions();
                }
            },
            Op::ReceiverWriteAddCredit => {
                let Some(channel) = self.add_credit_queue.pop_front() else {
                    return false;
                };
                if let Some(credit) = self.gate.take_unannounced_credit(channel) {
                    self.credit_announced[channel.0] += u64::from(credit.get());
                    self.to_sender.push_back((channel.0, credit));
                }
            }
            Op::DeliverToSender => {
                let Some((ch, credit)) = self.to_sender.pop_front() else {
                    return false;
                };
                self.credit_received[ch] += u64::from(credit.get());
                if !self.readers[ch].cancelled {
                    self.readers[ch].credit.on_add_credit(credit).unwrap();
                    self.schedule(ch);
                }
            }
            Op::Recycle(i) => {
                if self.held.is_empty() {
                    return false;
                }
                let lease = self.held.swap_remove(i % self.held.len());
                self.gate.on_buffer_recycled(lease).unwrap();
                self.drain_receiver_actions();
            }
            Op::Release(ch) => {
                let ch = ch % self.readers.len();
                if self.readers[ch].cancelled {
                    return false;
                }
                self.gate.release_channel(ChannelId(ch)).unwrap();
                // The CancelPartitionRequest is modelled as arriving at once.
                self.readers[ch].cancelled = true;
                self.ready.remove(ch);
                self.drain_receiver_actions();
            }
        }
        true
    }

    /// Panics unless every invariant of the module docs of [`crate::protocol::credit`] holds.
    pub fn check_invariants(&self) {
        let config = self.gate.config();
        let mut floating_held = 0;
        for (ch, reader) in self.readers.iter().enumerate() {
            let id = ChannelId(ch);
            let s = self.stats(id);
            floating_held += s.floating_available + s.floating_in_use;
            if s.released {
                assert_eq!((s.available(), s.unannounced), (0, Credit::ZERO));
                continue;
            }
            assert_eq!(
                s.exclusive_available + s.exclusive_in_use,
                config.exclusive_buffers_per_channel
            );
            // Every announced credit is the sender's, in flight to it, or taken by data in
            // flight: so every data buffer in flight that needs a buffer has one waiting
            // (record body buffers land in their record's memory).
            let credit_in_flight: u32 = self
                .to_sender
                .iter()
                .filter(|(c, _)| *c == ch)
                .map(|(_, credit)| credit.get())
                .sum();
            let data_in_flight = self
                .to_receiver
                .iter()
                .filter(|m| {
                    matches!(m, ToReceiver::Buffer { channel, header, item }
                        if *channel == ch && header.data_type == DataType::Data
                            && !matches!(item, Item::Data(_, _, true)))
                })
                .count() as u32;
            assert_eq!(
                s.announced.get(),
                reader.credit.credit().get() + credit_in_flight + data_in_flight,
                "{id}: announced credit must equal sender credit + AddCredit in flight + data in flight"
            );
            // Unannounced credit is never forgotten: the channel is queued for an AddCredit.
            let queued = self.add_credit_queue.iter().filter(|c| **c == id).count();
            assert_eq!(
                queued,
                usize::from(!s.unannounced.is_zero()),
                "{id}: AddCredit queue entries"
            );
            // A channel short of buffers waits, and then the gate has none to give.
            if s.required > s.available() {
                assert!(s.waiting_for_floating, "{id} is short of buffers but not waiting");
                assert_eq!(
                    self.gate.available_floating(),
                    0,
                    "{id} is short while the gate has buffers"
                );
            }
            // Sequence numbers are contiguous: the receiver expects what the sender numbers next
            // minus what is still on the wire.
            let responses_in_flight = self
                .to_receiver
                .iter()
                .filter(|m| matches!(m, ToReceiver::Buffer { channel, .. } if *channel == ch))
                .count() as u64;
            assert_eq!(
                s.expected_sequence_number + responses_in_flight,
                reader.credit.next_sequence_number()
            );
            // What arrived is a prefix of what was produced, in order.
            assert_eq!(
                self.delivered[ch][..],
                self.produced[ch][..self.delivered[ch].len()]
            );
        }
        assert_eq!(
            floating_held + self.gate.available_floating(),
            config.floating_buffers,
            "floating buffers must be conserved"
        );
    }

    /// A consumer that recycles everything, and a transport that does every pending step,
    /// until nothing moves. Then everything produced must have been delivered.
    pub fn drain(&mut self) {
        for _ in 0..100_000 {
            let ops = [
                Op::DeliverToReceiver,
                Op::ReceiverWriteAddCredit,
                Op::DeliverToSender,
                Op::SenderWrite,
                Op::Recycle(0),
            ];
            let mut moved = false;
            for op in &ops {
                moved |= self.apply(op);
                self.check_invariants();
            }
            if !moved {
                break;
            }
        }
        assert!(self.to_receiver.is_empty() && self.to_sender.is_empty() && self.add_credit_queue.is_empty());
        assert!(self.held.is_empty());
        for (ch, reader) in self.readers.iter().enumerate() {
            if reader.cancelled {
                continue;
            }
            // Liveness: with everything recycled, a sender with backlog has credit.
            assert!(
                reader.backlog() == 0 || reader.credit.can_send_data(),
                "channel {ch} stuck: backlog {} without credit",
                reader.backlog()
            );
            assert!(reader.queue.is_empty(), "channel {ch} has undelivered items");
            assert_eq!(self.delivered[ch], self.produced[ch], "channel {ch}");
            assert_eq!(self.credit_announced[ch], self.credit_received[ch]);
        }
    }
}

/// Most operations one scenario runs (keeps an execution fast).
const MAX_OPS: usize = 4096;

/// One operation from the fuzzer's bytes (weights as in the property test), `None` at the end.
fn op(input: &mut Bytes<'_>) -> Option<Op> {
    let b = input.u8()?;
    let arg = usize::from(input.u8().unwrap_or(0));
    Some(match b % 25 {
        0..=3 => Op::Produce(arg % 4),
        4 => Op::ProduceEvent(arg % 4),
        5..=8 => Op::SenderWrite,
        9..=12 => Op::DeliverToReceiver,
        13..=15 => Op::ReceiverWriteAddCredit,
        16..=18 => Op::DeliverToSender,
        19..=21 => Op::Recycle(arg),
        22 => Op::Release(arg % 4),
        _ => Op::ProduceRecord(arg % 4, arg / 4),
    })
}

/// A gate configuration as the property test draws it: 0–3 exclusive, 0–6 floating buffers
/// (at least 1 without exclusive ones).
pub fn config(exclusive: u32, floating: u32) -> GateCreditConfig {
    let (exclusive, floating) = (exclusive % 4, floating % 7);
    GateCreditConfig {
        exclusive_buffers_per_channel: exclusive,
        floating_buffers: if exclusive == 0 { floating.max(1) } else { floating },
    }
}

/// Runs one scenario: a byte for the number of channels (1–4), two for the configuration,
/// then operations (two bytes each); invariants after every step, then everything must
/// drain and be delivered in order.
pub fn run(data: &[u8]) {
    let mut input = Bytes::new(data);
    let channels = usize::from(input.u8().unwrap_or(0) % 4) + 1;
    let cfg = config(
        u32::from(input.u8().unwrap_or(2)),
        u32::from(input.u8().unwrap_or(8)),
    );
    let mut pair = Pair::new(channels, cfg);
    pair.check_invariants();
    for _ in 0..MAX_OPS {
        let Some(op) = op(&mut input) else { break };
        pair.apply(&op);
        pair.check_invariants();
    }
    pair.drain();
}
