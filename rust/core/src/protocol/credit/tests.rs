//! Unit and property tests of both sides of credit, driven against each other in memory
//! through the fuzz model ([`crate::fuzz::credit`]).

use super::*;
use crate::base::error::Error;
use crate::fuzz::credit::{self as model, Op, Pair};
use proptest::prelude::*;

fn gate(exclusive: u32, floating: u32) -> GateCredit {
    GateCredit::new(GateCreditConfig {
        exclusive_buffers_per_channel: exclusive,
        floating_buffers: floating,
    })
    .unwrap()
}

fn data(sequence_number: u64, backlog: u32) -> BufferHeader {
    BufferHeader {
        sequence_number,
        backlog,
        data_type: DataType::Data,
    }
}

fn event(sequence_number: u64, backlog: u32) -> BufferHeader {
    BufferHeader {
        sequence_number,
        backlog,
        data_type: DataType::Event,
    }
}

fn actions(gate: &mut GateCredit) -> Vec<ReceiverAction> {
    std::iter::from_fn(|| gate.poll_action()).collect()
}

fn add_credit(channel: ChannelId) -> ReceiverAction {
    ReceiverAction::SendAddCredit { channel }
}

fn lease(delivery: Delivery) -> BufferLease {
    match delivery {
        Delivery::Data(lease) => lease,
        other => panic!("expected data, got {other:?}"),
    }
}

fn stats(gate: &GateCredit, channel: ChannelId) -> ChannelCreditStats {
    gate.channel_stats(channel).unwrap()
}

#[test]
fn default_config_is_two_exclusive_and_eight_floating() {
    let config = GateCreditConfig::default();
    assert_eq!(config.exclusive_buffers_per_channel, 2);
    assert_eq!(config.floating_buffers, 8);
}

#[test]
fn gate_without_any_buffers_is_rejected() {
    assert!(matches!(
        GateCredit::new(GateCreditConfig {
            exclusive_buffers_per_channel: 0,
            floating_buffers: 0
        }),
        Err(CreditError::NoBuffers)
    ));
    assert!(GateCredit::new(GateCreditConfig {
        exclusive_buffers_per_channel: u32::MAX,
        floating_buffers: 1
    })
    .is_err());
}

#[test]
fn initial_credit_equals_exclusive_buffers() {
    let mut g = gate(3, 8);
    let ch = g.add_channel();
    assert_eq!(g.initial_credit(), Credit::new(3));
    let s = stats(&g, ch);
    assert_eq!(
        (s.exclusive_available, s.announced, s.unannounced),
        (3, Credit::new(3), Credit::ZERO)
    );
    assert_eq!(SenderCredit::new(g.initial_credit()).credit(), Credit::new(3));
    assert!(
        actions(&mut g).is_empty(),
        "initial credit travels in the PartitionRequest"
    );
}

#[test]
fn record_body_buffers_need_no_credit_and_take_no_buffer() {
    let mut g = gate(1, 0);
    let ch = g.add_channel();
    // The record's first buffer (its length prefix) takes the channel's one buffer.
    let first = lease(g.on_buffer_response(ch, data(0, 0)).unwrap());
    let s = stats(&g, ch);
    assert_eq!((s.available(), s.announced), (0, Credit::ZERO));
    // With no credit left, buffers inside the record still land in it, taking nothing.
    for seq in 1..=3 {
        assert_eq!(
            g.on_buffer_response_inside_record(ch, data(seq, 0)).unwrap(),
            Delivery::Record
        );
    }
    assert_eq!(
        stats(&g, ch),
        ChannelCreditStats {
            expected_sequence_number: 4,
            ..s
        }
    );
    assert!(actions(&mut g).is_empty(), "nothing to announce");
    // The buffer that completes the record needs credit like any other.
    assert!(matches!(
        g.on_buffer_response(ch, data(4, 0)),
        Err(CreditError::ArrivedWithoutCredit {
            sequence_number: 4,
            ..
        })
    ));
    g.on_buffer_recycled(first).unwrap();
    assert_eq!(g.take_unannounced_credit(ch), Some(Credit::ONE));
    assert!(matches!(
        g.on_buffer_response(ch, data(4, 0)).unwrap(),
        Delivery::Data(_)
    ));
}

#[test]
fn record_body_buffers_are_still_checked_and_dropped_for_a_released_channel() {
    let mut g = gate(1, 0);
    let ch = g.add_channel();
    assert!(matches!(
        g.on_buffer_response_inside_record(ch, data(1, 0)),
        Err(CreditError::OutOfOrder { .. })
    ));
    assert!(matches!(
        g.on_buffer_response_inside_record(ChannelId(9), data(0, 0)),
        Err(CreditError::UnknownChannel { .. })
    ));
    // Events inside a record are events.
    assert_eq!(
        g.on_buffer_response_inside_record(ch, event(0, 0)).unwrap(),
        Delivery::Event
    );
    g.release_channel(ch).unwrap();
    assert_eq!(
        g.on_buffer_response_inside_record(ch, data(1, 0)).unwrap(),
        Delivery::Discarded
    );
}

#[test]
fn a_sender_sends_record_body_buffers_without_credit() {
    let mut sender = SenderCredit::new(Credit::ONE);
    sender.on_buffer_sent(DataType::Data, 3).unwrap();
    assert!(!sender.is_available(QueueHead::Data));
    assert!(sender.is_available(QueueHead::RecordBody));
    let header = sender.on_record_body_sent(2);
    assert_eq!(
        header,
        BufferHeader {
            sequence_number: 1,
            backlog: 2,
            data_type: DataType::Data
        }
    );
    assert_eq!(
        (sender.credit(), sender.next_sequence_number()),
        (Credit::ZERO, 2)
    );
}

#[test]
fn an_announcement_is_due_once_half_the_empty_buffers_are_unannounced() {
    let mut g = gate(4, 0);
    let ch = g.add_channel();
    assert!(!g.announcement_due(ch), "all four announced in the request");
    let leases: Vec<_> = (0..4)
        .map(|seq| lease(g.on_buffer_response(ch, data(seq, 0)).unwrap()))
        .collect();
    let mut leases = leases.into_iter();
    g.on_buffer_recycled(leases.next().unwrap()).unwrap();
    // 1 unannounced, 0 announced (the other three buffers are in use).
    assert!(g.announcement_due(ch));
    assert_eq!(g.take_unannounced_credit(ch), Some(Credit::new(1)));
    assert!(!g.announcement_due(ch), "nothing left to announce");
    g.on_buffer_recycled(leases.next().unwrap()).unwrap();
    // 1 unannounced against 1 announced: half.
    assert!(g.announcement_due(ch));
    assert!(!g.announcement_due(ChannelId(7)), "unknown channel");
}

#[test]
fn backlog_requests_floating_buffers() {
    let mut g = gate(2, 8);
    let ch = g.add_channel();
    let l = lease(g.on_buffer_response(ch, data(0, 5)).unwrap());
    assert_eq!(l.origin(), BufferOrigin::Exclusive);
    // Wants 5 + 2 = 7, holds 1 empty exclusive buffer: takes 6 floating ones.
    let s = stats(&g, ch);
    assert_eq!(
        (s.required, s.floating_available, s.unannounced),
        (7, 6, Credit::new(6))
    );
    assert_eq!(g.available_floating(), 2);
    assert_eq!(actions(&mut g), vec![add_credit(ch)]);
    assert_eq!(g.take_unannounced_credit(ch), Some(Credit::new(6)));
    assert_eq!(g.take_unannounced_credit(ch), None);
}

#[test]
fn channels_wait_for_floating_buffers_in_fifo_order() {
    let mut g = gate(1, 2);
    let [a, b, c] = [g.add_channel(), g.add_channel(), g.add_channel()];
    let la = lease(g.on_buffer_response(a, data(0, 3)).unwrap()); // wants 4, gets both floating
    let _lb = lease(g.on_buffer_response(b, data(0, 1)).unwrap()); // wants 2, waits
    let _lc = lease(g.on_buffer_response(c, data(0, 1)).unwrap()); // wants 2, waits
    assert_eq!(stats(&g, a).floating_available, 2);
    assert!(stats(&g, a).waiting_for_floating && stats(&g, b).waiting_for_floating);
    actions(&mut g);
    g.take_unannounced_credit(a);
    // `a` uses a floating buffer and recycles it: `a` waited first, so it gets it back.
    let fa = lease(g.on_buffer_response(a, data(1, 3)).unwrap());
    assert_eq!(fa.origin(), BufferOrigin::Floating);
    g.on_buffer_recycled(fa).unwrap();
    assert_eq!(stats(&g, a).floating_available, 2);
    assert!(stats(&g, a).waiting_for_floating);
    // Its exclusive buffer comes back as credit; then backlog 0 leaves `a` content, and the
    // next floating buffer goes to `b`, which waited before `a` queued again.
    g.on_buffer_recycled(la).unwrap();
    actions(&mut g);
    let fa = lease(g.on_buffer_response(a, data(2, 0)).unwrap());
    g.on_buffer_recycled(fa).unwrap();
    assert_eq!(
        (stats(&g, b).floating_available, stats(&g, c).floating_available),
        (1, 0)
    );
    assert_eq!(actions(&mut g), vec![add_credit(b)]);
}

#[test]
fn add_credit_only_on_zero_to_positive() {
    let mut g = gate(3, 0);
    let ch = g.add_channel();
    let leases: Vec<_> = (0..3)
        .map(|seq| lease(g.on_buffer_response(ch, data(seq, 0)).unwrap()))
        .collect();
    let mut emitted = Vec::new();
    for l in leases {
        g.on_buffer_recycled(l).unwrap();
        emitted.extend(actions(&mut g));
    }
    assert_eq!(
        emitted,
        vec![add_credit(ch)],
        "three recycles, one AddCredit request"
    );
    assert_eq!(g.take_unannounced_credit(ch), Some(Credit::new(3)));
    // Back at zero: the next buffer asks again.
    let l = lease(g.on_buffer_response(ch, data(3, 0)).unwrap());
    g.on_buffer_recycled(l).unwrap();
    assert_eq!(actions(&mut g), vec![add_credit(ch)]);
}

#[test]
fn sequence_gap_is_a_protocol_error() {
    let mut g = gate(2, 0);
    let ch = g.add_channel();
    let _l = g.on_buffer_response(ch, data(0, 0)).unwrap();
    let before = stats(&g, ch);
    assert!(matches!(
        g.on_buffer_response(ch, data(2, 0)),
        Err(CreditError::OutOfOrder {
            expected: 1,
            got: 2,
            ..
        })
    ));
    assert!(matches!(
        g.on_buffer_response(ch, data(0, 0)),
        Err(CreditError::OutOfOrder {
            expected: 1,
            got: 0,
            ..
        })
    ));
    assert_eq!(stats(&g, ch), before, "a rejected response changes nothing");
}

#[test]
fn data_without_credit_is_a_protocol_error() {
    let mut g = gate(1, 1);
    let ch = g.add_channel();
    let _l = g.on_buffer_response(ch, data(0, 0)).unwrap();
    assert!(matches!(
        g.on_buffer_response(ch, data(1, 0)),
        Err(CreditError::ArrivedWithoutCredit {
            sequence_number: 1,
            ..
        })
    ));
    // Unannounced buffers are not credit either.
    let mut g = gate(0, 1);
    let ch = g.add_channel();
    g.on_backlog_announcement(ch, 1).unwrap();
    assert_eq!(stats(&g, ch).unannounced, Credit::ONE);
    assert!(matches!(
        g.on_buffer_response(ch, data(0, 0)),
        Err(CreditError::ArrivedWithoutCredit {
            sequence_number: 0,
            ..
        })
    ));
}

#[test]
fn unknown_channel_is_a_protocol_error() {
    let mut g = gate(2, 8);
    assert!(matches!(
        g.on_buffer_response(ChannelId(7), data(0, 0)),
        Err(CreditError::UnknownChannel { channel: 7, .. })
    ));
    assert!(matches!(
        g.on_backlog_announcement(ChannelId(7), 1),
        Err(CreditError::UnknownChannel { channel: 7, .. })
    ));
}

#[test]
fn events_need_no_credit() {
    let mut sender = SenderCredit::new(Credit::ZERO);
    assert!(!sender.can_send_data());
    assert!(sender.is_available(QueueHead::Event));
    assert!(!sender.is_available(QueueHead::Data));
    let header = sender.on_buffer_sent(DataType::Event, 0).unwrap();
    assert_eq!(header, event(0, 0));
    assert_eq!(sender.credit(), Credit::ZERO);

    let mut g = gate(1, 1);
    let ch = g.add_channel();
    let _l = g.on_buffer_response(ch, data(0, 0)).unwrap();
    assert_eq!(stats(&g, ch).announced, Credit::ZERO);
    assert_eq!(g.on_buffer_response(ch, event(1, 0)).unwrap(), Delivery::Event);
    assert_eq!(stats(&g, ch).expected_sequence_number, 2);
}

#[test]
fn sender_data_uses_credit_and_numbers_every_response() {
    let mut sender = SenderCredit::new(Credit::new(2));
    let headers: Vec<_> = [DataType::Data, DataType::Event, DataType::Data]
        .into_iter()
        .map(|t| sender.on_buffer_sent(t, 4).unwrap())
        .collect();
    assert_eq!(
        headers.iter().map(|h| h.sequence_number).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    assert!(headers.iter().all(|h| h.backlog == 4));
    assert_eq!(sender.credit(), Credit::ZERO);
    assert!(matches!(
        sender.on_buffer_sent(DataType::Data, 3),
        Err(CreditError::SentWithoutCredit(_))
    ));
    assert_eq!(
        sender.next_sequence_number(),
        3,
        "a refused send uses no sequence number"
    );
    sender.on_add_credit(Credit::ONE).unwrap();
    assert!(sender.can_send_data());
}

#[test]
fn exclusive_zero_relies_on_backlog() {
    let mut g = gate(0, 4);
    let ch = g.add_channel();
    let mut sender = SenderCredit::new(g.initial_credit());
    assert_eq!(sender.credit(), Credit::ZERO);
    // Two data buffers queued, no credit: announce the backlog, once.
    assert!(!sender.is_available(QueueHead::Data));
    assert!(sender.needs_backlog_announcement(2));
    sender.on_backlog_announced(2);
    assert!(!sender.needs_backlog_announcement(3));
    g.on_backlog_announcement(ch, 2).unwrap();
    assert_eq!(actions(&mut g), vec![add_credit(ch)]);
    sender
        .on_add_credit(g.take_unannounced_credit(ch).unwrap())
        .unwrap();
    assert_eq!(sender.credit(), Credit::new(2));
    for seq in 0..2 {
        let header = sender.on_buffer_sent(DataType::Data, 1 - seq as u32).unwrap();
        let l = lease(g.on_buffer_response(ch, header).unwrap());
        assert_eq!(l.origin(), BufferOrigin::Floating);
        g.on_buffer_recycled(l).unwrap();
    }
    // Everything recycled and no backlog: the floating buffers are all back in the gate.
    assert_eq!(g.available_floating(), 4);
    assert!(actions(&mut g).is_empty());
    // New data after "backlog 0": announce again.
    assert!(sender.needs_backlog_announcement(1));
    // With exclusive buffers, the sender never announces: they come back by themselves.
    assert!(!SenderCredit::new(Credit::ONE).needs_backlog_announcement(5));
}

#[test]
fn credit_overflow_is_protocol_error() {
    let mut sender = SenderCredit::new(Credit::new(u32::MAX - 1));
    sender.on_add_credit(Credit::ONE).unwrap();
    assert!(matches!(
        sender.on_add_credit(Credit::ONE),
        Err(CreditError::Overflow { .. })
    ));
    assert_eq!(sender.credit(), Credit::new(u32::MAX));
    assert!(matches!(
        Credit::ZERO.checked_sub(Credit::ONE),
        Err(CreditError::Underflow { .. })
    ));
}

#[test]
fn zero_add_credit_is_protocol_error() {
    let mut sender = SenderCredit::new(Credit::ONE);
    assert!(matches!(
        sender.on_add_credit(Credit::ZERO),
        Err(CreditError::ZeroAddCredit)
    ));
}

#[test]
fn surplus_floating_returned_on_recycle() {
    let mut g = gate(2, 8);
    let ch = g.add_channel();
    let first = lease(g.on_buffer_response(ch, data(0, 3)).unwrap()); // exclusive; wants 5, gets 4
    assert_eq!(stats(&g, ch).floating_available, 4);
    actions(&mut g);
    g.take_unannounced_credit(ch);
    let second = lease(g.on_buffer_response(ch, data(1, 0)).unwrap()); // floating; wants 2
    assert_eq!(
        (second.origin(), stats(&g, ch).available()),
        (BufferOrigin::Floating, 4)
    );
    // 4 empty buffers, 2 needed: the recycled exclusive buffer stays, a floating one leaves.
    g.on_buffer_recycled(first).unwrap();
    let s = stats(&g, ch);
    assert_eq!(
        (s.exclusive_available, s.floating_available, s.unannounced),
        (2, 2, Credit::ZERO)
    );
    assert_eq!(g.available_floating(), 5);
    // A recycled floating buffer always goes back to the gate when nobody waits.
    g.on_buffer_recycled(second).unwrap();
    assert_eq!(g.available_floating(), 6);
    assert!(
        actions(&mut g).is_empty(),
        "no new credit: the sender's credit still matches"
    );
}

#[test]
fn release_returns_floating_buffers_to_the_gate() {
    let mut g = gate(1, 3);
    let [a, b] = [g.add_channel(), g.add_channel()];
    let la = lease(g.on_buffer_response(a, data(0, 3)).unwrap()); // wants 4, holds 3 floating
    let _lb = lease(g.on_buffer_response(b, data(0, 1)).unwrap()); // wants 2, waits
    actions(&mut g);
    g.release_channel(a).unwrap();
    g.release_channel(a).unwrap();
    // The waiting `b` takes the two floating buffers it needs, the gate gets the rest.
    assert_eq!(stats(&g, b).floating_available, 2);
    assert_eq!(g.available_floating(), 1);
    assert_eq!(actions(&mut g), vec![add_credit(b)]);
    // Late arrivals and late recycles for `a` are harmless.
    assert_eq!(g.on_buffer_response(a, data(1, 0)).unwrap(), Delivery::Discarded);
    g.on_buffer_recycled(la).unwrap();
    assert_eq!(g.take_unannounced_credit(a), None);
    assert_eq!(stats(&g, a).available(), 0);
}

#[test]
fn foreign_lease_is_rejected() {
    let mut g1 = gate(1, 1);
    let mut g2 = gate(1, 1);
    let ch = g1.add_channel();
    g2.add_channel();
    let l = lease(g1.on_buffer_response(ch, data(0, 0)).unwrap());
    assert_eq!(g2.on_buffer_recycled(l), Err(CreditError::ForeignLease(ch.0)));
}

#[test]
fn ready_queue_holds_each_reader_once_and_serves_round_robin() {
    let mut q = ReadyQueue::new();
    assert!(q.enqueue('a'));
    assert!(q.enqueue('b'));
    assert!(!q.enqueue('a'));
    assert_eq!(q.len(), 2);
    let mut served = Vec::new();
    for _ in 0..5 {
        let r = q.dequeue().unwrap();
        served.push(r);
        q.enqueue(r); // still available
    }
    assert_eq!(served, vec!['a', 'b', 'a', 'b', 'a']);
    assert!(q.remove('a') && !q.remove('a') && !q.contains('a'));
    assert_eq!((q.dequeue(), q.dequeue(), q.is_empty()), (Some('b'), None, true));
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..4usize).prop_map(Op::Produce),
        1 => (0..4usize).prop_map(Op::ProduceEvent),
        4 => Just(Op::SenderWrite),
        4 => Just(Op::DeliverToReceiver),
        3 => Just(Op::ReceiverWriteAddCredit),
        3 => Just(Op::DeliverToSender),
        3 => any::<usize>().prop_map(Op::Recycle),
        1 => (0..4usize).prop_map(Op::Release),
        2 => (0..4usize, 0..5usize).prop_map(|(c, n)| Op::ProduceRecord(c, n)),
    ]
}

fn config() -> impl Strategy<Value = GateCreditConfig> {
    (0..4u32, 0..7u32).prop_map(|(exclusive, floating)| model::config(exclusive, floating))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn random_interleavings_keep_credit_consistent_and_deliver_everything(
        channels in 1..5usize,
        config in config(),
        ops in prop::collection::vec(op(), 0..300),
    ) {
        let mut pair = Pair::new(channels, config);
        pair.check_invariants();
        for op in &ops {
            pair.apply(op);
            pair.check_invariants();
        }
        pair.drain();
    }

    #[test]
    fn ready_queue_answers_as_a_reference_model(ops in prop::collection::vec(any::<u8>(), 0..400)) {
        crate::fuzz::ready_queue::run(&ops);
    }

    #[test]
    fn credit_arithmetic_is_checked(a in any::<u32>(), b in any::<u32>()) {
        let (x, y) = (Credit::new(a), Credit::new(b));
        prop_assert_eq!(x.checked_add(y).ok().map(Credit::get), a.checked_add(b));
        prop_assert_eq!(x.checked_sub(y).ok().map(Credit::get), a.checked_sub(b));
    }
}

#[test]
fn credit_errors_keep_their_text_upward_as_protocol_or_invalid_argument() {
    let broken = CreditError::OutOfOrder {
        channel: 2,
        expected: 1,
        got: 3,
    };
    assert!(matches!(
        Error::from(broken),
        Error::Protocol(m) if m == "channel 2: buffer out of order: expected sequence number 1, got 3"
    ));
    let overflow = Credit::new(u32::MAX).checked_add(Credit::ONE).unwrap_err();
    assert_eq!(
        overflow.to_string(),
        "credit overflow: 4294967295 + 1 exceeds 4294967295"
    );
    assert!(matches!(
        Error::from(CreditError::ForeignLease(4)),
        Error::InvalidArgument(m) if m == "buffer lease of channel 4 is not from this gate"
    ));
}
