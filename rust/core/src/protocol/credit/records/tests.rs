//! Tests of record bytes (protocol version 3): [`RecordBudget`] and the record side of
//! [`SenderCredit`], unit by unit, then many senders against one gate in memory with the
//! bound checked after every step and every record delivered in the end.

use super::*;
use crate::fuzz::records::Model;
use crate::protocol::credit::{Credit, CreditError, SenderCredit};
use proptest::prelude::*;

const MIB: u64 = 1 << 20;

#[test]
fn a_record_starts_only_on_granted_bytes() {
    let mut gate = RecordBudget::new(16 * MIB);
    let c = gate.add_channel();
    let mut sender = SenderCredit::new(Credit::new(2));
    assert!(
        sender.can_start_records(0),
        "a buffer starting no record needs no grant"
    );
    assert!(!sender.can_start_records(MIB));
    assert!(sender.needs_record_announcement(MIB));
    sender.on_record_announced(MIB);
    assert!(!sender.needs_record_announcement(MIB), "announced once");
    assert!(sender.on_records_started(MIB).is_err(), "not without the grant");
    assert!(matches!(
        gate.on_records_started(c, 1),
        Err(CreditError::RecordWithoutGrant { granted: 0, .. })
    ));

    // Granted ahead up to the channel's window: half the budget, for its only channel.
    gate.on_record_announcement(c, MIB).unwrap();
    assert_eq!(gate.poll_grant(), Some((c, 8 * MIB)));
    assert_eq!(gate.poll_grant(), None);
    assert_eq!(gate.granted(), 8 * MIB);
    sender.on_record_grant(8 * MIB).unwrap();
    assert!(sender.can_start_records(MIB));
    assert!(!sender.can_start_records(8 * MIB + 1));
    sender.on_records_started(MIB).unwrap();
    assert_eq!(sender.record_granted(), 7 * MIB);
    assert!(
        !sender.needs_record_announcement(MIB),
        "the grant covers the next one too"
    );
    gate.on_records_started(c, MIB).unwrap();
    assert_eq!((gate.held(), gate.granted(), gate.peak()), (MIB, 7 * MIB, MIB));
    assert!(gate.on_records_started(c, 7 * MIB + 1).is_err());
    gate.on_records_taken(c, MIB);
    assert_eq!((gate.held(), gate.peak()), (0, MIB));
    assert_eq!(
        gate.on_record_announcement(c, 0),
        Err(CreditError::BadRecordBytes(0))
    );
    assert_eq!(sender.on_record_grant(0), Err(CreditError::BadRecordBytes(0)));
}

#[test]
fn over_budget_the_next_record_waits_and_a_huge_one_goes_alone() {
    let mut gate = RecordBudget::new(16 * MIB);
    let (a, b, c) = (gate.add_channel(), gate.add_channel(), gate.add_channel());
    // 48 MB > the whole budget: granted, since the gate holds nothing.
    gate.on_record_announcement(a, 48 * MIB).unwrap();
    assert_eq!(gate.poll_grant(), Some((a, 48 * MIB)));
    // Now the gate is beyond its budget: nobody else starts, however small.
    gate.on_record_announcement(b, 1).unwrap();
    gate.on_record_announcement(c, 4 * MIB).unwrap();
    assert_eq!(gate.poll_grant(), None);
    assert!(gate.channel_stats(b).unwrap().waiting);
    gate.on_records_started(a, 48 * MIB).unwrap();
    assert_eq!(gate.poll_grant(), None);
    // The consumer takes it: the waiting channels are served in order while under budget.
    gate.on_records_taken(a, 48 * MIB);
    // b is granted ahead up to its window (half the budget over three channels); c's record
    // is larger than that, so it gets just its record.
    let window = 16 * MIB / 6;
    assert_eq!(gate.poll_grant(), Some((b, window)));
    assert_eq!(gate.poll_grant(), Some((c, 4 * MIB)));
    assert_eq!(gate.peak_reserved(), 48 * MIB);
}

#[test]
fn an_announcement_covered_by_a_grant_in_flight_gets_nothing_more() {
    let mut gate = RecordBudget::new(16 * MIB);
    let c = gate.add_channel();
    // Records larger than the channel's window (8 MiB) are granted exactly.
    gate.on_record_announcement(c, 9 * MIB).unwrap();
    assert_eq!(gate.poll_grant(), Some((c, 9 * MIB)));
    // The sender announced again before the grant arrived (a different head): only the
    // difference is granted.
    gate.on_record_announcement(c, 9 * MIB).unwrap();
    assert_eq!(gate.poll_grant(), None);
    gate.on_record_announcement(c, 10 * MIB).unwrap();
    assert_eq!(gate.poll_grant(), Some((c, MIB)));
}

#[test]
fn grants_ahead_stay_within_the_window_and_half_the_budget() {
    let mut gate = RecordBudget::new(16 * MIB);
    let ch: Vec<_> = (0..4).map(|_| gate.add_channel()).collect();
    // Four live channels: a window of 2 MiB each.
    gate.on_record_announcement(ch[0], MIB / 2).unwrap();
    assert_eq!(gate.poll_grant(), Some((ch[0], 2 * MIB)));
    // A record larger than the window is granted exactly.
    gate.on_records_started(ch[0], MIB / 2).unwrap();
    gate.on_record_announcement(ch[1], 5 * MIB + MIB / 2).unwrap();
    assert_eq!(gate.poll_grant(), Some((ch[1], 5 * MIB + MIB / 2)));
    gate.on_records_started(ch[1], 5 * MIB + MIB / 2).unwrap();
    // ch1 used its whole grant: topped up, unasked, but only to half the budget (held records
    // count): 6 MiB held and 1.5 MiB granted leave half a MiB.
    assert_eq!(gate.poll_grant(), Some((ch[1], MIB / 2)));
    let half = 8 * MIB;
    assert_eq!((gate.held(), gate.granted()), (6 * MIB, 2 * MIB));
    // ch0 used less than half its window: no top-up.
    assert_eq!(gate.channel_stats(ch[0]).unwrap().granted, 3 * MIB / 2);
    // At half the budget, only what the next buffer starts.
    gate.on_record_announcement(ch[2], 1).unwrap();
    assert_eq!(gate.poll_grant(), Some((ch[2], 1)));
    gate.on_record_announcement(ch[3], 1).unwrap();
    assert_eq!(gate.poll_grant(), Some((ch[3], 1)));
    assert_eq!(gate.held() + gate.granted(), half + 2);
    // A released channel's share goes to the others: the window grows.
    for &c in &ch[1..] {
        gate.release_channel(c);
    }
    gate.on_records_taken(ch[1], 5 * MIB + MIB / 2);
    gate.on_records_taken(ch[0], MIB / 2);
    gate.on_record_announcement(ch[0], 2 * MIB).unwrap();
    assert_eq!(gate.poll_grant(), Some((ch[0], 8 * MIB - 3 * MIB / 2)));
}

#[test]
fn releasing_a_channel_returns_its_grant_and_serves_the_next() {
    let mut gate = RecordBudget::new(10);
    let (a, b) = (gate.add_channel(), gate.add_channel());
    gate.on_record_announcement(a, 10).unwrap();
    gate.on_record_announcement(b, 5).unwrap();
    assert_eq!(gate.poll_grant(), Some((a, 10)));
    assert_eq!(gate.poll_grant(), None);
    gate.release_channel(a);
    assert_eq!(gate.granted(), 5);
    assert_eq!(gate.poll_grant(), Some((b, 5)));
    gate.release_channel(a);
    gate.on_record_announcement(a, 3).unwrap();
    assert_eq!(gate.poll_grant(), None, "a released channel is granted nothing");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Random interleavings keep the bound after every step, and once every side runs to
    /// quiescence every record is delivered in order: no deadlock, also when every record is
    /// larger than the whole budget.
    #[test]
    fn record_bytes_stay_within_budget_plus_one_record_and_everything_arrives(
        budget in 1u64..64,
        huge in any::<bool>(),
        records in prop::collection::vec(prop::collection::vec(1u64..48, 0..6), 1..6),
        ops in prop::collection::vec((any::<u8>(), any::<usize>()), 0..300),
    ) {
        // `huge`: every record is larger than the budget.
        let records: Vec<Vec<u64>> = if huge {
            records.iter().map(|r| r.iter().map(|s| s + budget).collect()).collect()
        } else {
            records
        };
        let mut m = Model::new(budget, records.clone());
        for (op, channel) in ops {
            m.step(op, channel);
        }
        m.drain();
        m.assert_all_delivered(&records);
    }
}
