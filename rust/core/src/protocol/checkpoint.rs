//! Checkpoint barriers at an input gate: the alignment state machine ([`Aligner`]) and the
//! bookkeeping of what unaligned barriers overtook ([`InFlight`]). Both are pure (no I/O,
//! no locks), so the gate drives them and the property tests below drive them the same way.
//!
//! **Aligned** barrier `n` (Flink's aligned checkpoints, blocking upstream): a channel that
//! delivered barrier `n` is *blocked* — the gate stops reading it, and a remote producer's
//! reader has paused itself after sending the barrier — until every channel that has not
//! ended delivered `n`. Then `n` is surfaced once and the blocked channels resume. The
//! explicit cases:
//! * a **higher id** `m > n` arriving while `n` is being aligned abandons `n`: an
//!   [`Action::Abort`] for `n` is surfaced, the channels blocked on `n` resume, and the
//!   alignment of `m` starts (an unaligned `m` is surfaced at once);
//! * a **stale id** (at most the last id surfaced or abandoned, or lower than the one being
//!   aligned) is ignored and counted ([`Aligner::stale`]); its channel is resumed, since its
//!   producer paused after sending it;
//! * a channel that **ends** during an alignment is no longer waited for;
//! * a **duplicate** barrier (`n` again on a channel that already delivered `n`) cannot
//!   happen with a well-behaved producer (the channel is blocked, and writers refuse
//!   non-increasing ids), so it is a protocol error, as is the same id once aligned and once
//!   unaligned.
//!
//! **Unaligned** barrier `n`: surfaced as soon as it arrives on the first channel; its copies
//! on the other channels are then expected and ignored (not counted as stale).

/// What the gate must do after feeding the [`Aligner`], in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Stop reading this channel: it delivered the barrier being aligned.
    Block(usize),
    /// Read these channels again (remote ones are sent a ResumeConsumption: their producer
    /// paused after an aligned barrier).
    Resume(Vec<usize>),
    /// Surface barrier `id` (each id at most once, ids increasing).
    Surface {
        /// The checkpoint id.
        id: u64,
        /// Whether it is an unaligned barrier.
        unaligned: bool,
    },
    /// Surface that the alignment of checkpoint `id` was abandoned (a higher id arrived).
    Abort {
        /// The checkpoint id.
        id: u64,
    },
}

/// A checkpoint being aligned.
#[derive(Debug, Clone)]
struct Pending {
    id: u64,
    arrived: Vec<bool>,
}

/// The alignment state machine of one gate (Flink: `SingleCheckpointBarrierHandler` with its
/// aligned and unaligned controllers), over `n` channels. See the module docs.
#[derive(Debug, Clone)]
pub struct Aligner {
    ended: Vec<bool>,
    pending: Option<Pending>,
    /// Highest id surfaced or abandoned.
    last: Option<u64>,
    /// Whether `last` was surfaced as an unaligned barrier (its copies are expected).
    last_unaligned: bool,
    stale: u64,
}

impl Aligner {
    /// A state machine for `channels` channels, none blocked, none ended.
    pub fn new(channels: usize) -> Aligner {
        Aligner {
            ended: vec![false; channels],
            pending: None,
            last: None,
            last_unaligned: false,
            stale: 0,
        }
    }

    /// Whether the gate must not read `channel` now.
    pub fn is_blocked(&self, channel: usize) -> bool {
        self.pending.as_ref().is_some_and(|p| p.arrived[channel])
    }

    /// The id being aligned, if any.
    pub fn aligning(&self) -> Option<u64> {
        self.pending.as_ref().map(|p| p.id)
    }

    /// Stale barriers ignored so far.
    pub fn stale(&self) -> u64 {
        self.stale
    }

    /// Barrier `id` arrived on `channel`. Fails with a protocol error for a duplicate, an id
    /// used both aligned and unaligned, a barrier on an ended channel or an unknown channel.
    pub fn on_barrier(&mut self, channel: usize, id: u64, unaligned: bool) -> crate::Result<Vec<Action>> {
        let protocol = |m: String| crate::Error::Protocol(m);
        match self.ended.get(channel) {
            None => return Err(protocol(format!("barrier {id} on unknown channel {channel}"))),
            Some(true) => {
                return Err(protocol(format!(
                    "barrier {id} on channel {channel} after its end"
                )))
            }
            Some(false) => {}
        }
        let resume_self = |unaligned: bool| {
            if unaligned {
                Vec::new()
            } else {
                vec![Action::Resume(vec![channel])]
            }
        };
        if self.last.is_some_and(|l| id <= l) {
            if !(unaligned && self.last_unaligned && Some(id) == self.last) {
                self.stale += 1;
            }
            return Ok(resume_self(unaligned));
        }
        let mut actions = Vec::new();
        if let Some(p) = &mut self.pending {
            if id < p.id {
                self.stale += 1;
                return Ok(resume_self(unaligned));
            }
            if id == p.id {
                if unaligned {
                    return Err(protocol(format!("checkpoint {id} arrived aligned and unaligned")));
                }
                if p.arrived[channel] {
                    return Err(protocol(format!(
                        "barrier {id} arrived twice on channel {channel}"
                    )));
                }
                p.arrived[channel] = true;
                actions.push(Action::Block(channel));
                self.try_complete(&mut actions);
                return Ok(actions);
            }
            // A higher id: abandon the alignment in progress.
            let p = self.pending.take().expect("checked above");
            self.last = Some(p.id);
            self.last_unaligned = false;
            actions.push(Action::Abort { id: p.id });
            actions.push(Action::Resume(arrived(&p.arrived)));
        }
        if unaligned {
            self.last = Some(id);
            self.last_unaligned = true;
            actions.push(Action::Surface { id, unaligned: true });
        } else {
            let mut arrived = vec![false; self.ended.len()];
            arrived[channel] = true;
            self.pending = Some(Pending { id, arrived });
            actions.push(Action::Block(channel));
            self.try_complete(&mut actions);
        }
        Ok(actions)
    }

    /// `channel` ended (end of partition): it is no longer waited for.
    pub fn on_end(&mut self, channel: usize) -> Vec<Action> {
        let mut actions = Vec::new();
        if let Some(e) = self.ended.get_mut(channel) {
            *e = true;
            self.try_complete(&mut actions);
        }
        actions
    }

    fn try_complete(&mut self, actions: &mut Vec<Action>) {
        let Some(p) = &self.pending else { return };
        if p.arrived.iter().zip(&self.ended).all(|(a, e)| *a || *e) {
            let p = self.pending.take().expect("checked above");
            self.last = Some(p.id);
            self.last_unaligned = false;
            actions.push(Action::Surface {
                id: p.id,
                unaligned: false,
            });
            actions.push(Action::Resume(arrived(&p.arrived)));
        }
    }
}

fn arrived(flags: &[bool]) -> Vec<usize> {
    flags
        .iter()
        .enumerate()
        .filter(|(_, a)| **a)
        .map(|(i, _)| i)
        .collect()
}

/// Which checkpoints each channel's next batches belong to as in-flight data, at the
/// moment the gate yields them (unaligned checkpoints only).
///
/// When unaligned barrier `n` is yielded, every channel not yet ended starts *recording*
/// for `n`; a channel stops when its position marker for `n` (where the producer wrote the
/// barrier) or its end is yielded. A batch yielded while its channel records is in-flight
/// data of those checkpoints: it was written before the barrier, yet reaches the user after
/// it. Each batch is yielded exactly once, so the contract never loses or repeats one (a
/// batch serialized across several buffers is one batch here). Memory: one small list of
/// checkpoint ids per channel.
#[derive(Debug, Clone)]
pub struct InFlight {
    recording: Vec<Vec<u64>>,
    ended: Vec<bool>,
}

impl InFlight {
    /// Bookkeeping for `channels` channels.
    pub fn new(channels: usize) -> InFlight {
        InFlight {
            recording: vec![Vec::new(); channels],
            ended: vec![false; channels],
        }
    }

    /// Unaligned barrier `id` was yielded.
    pub fn barrier(&mut self, id: u64) {
        for (rec, ended) in self.recording.iter_mut().zip(&self.ended) {
            if !ended {
                rec.push(id);
            }
        }
    }

    /// The position marker of barrier `id` on `channel` was reached.
    pub fn position(&mut self, channel: usize, id: u64) {
        self.recording[channel].retain(|&x| x != id);
    }

    /// `channel` ended.
    pub fn ended(&mut self, channel: usize) {
        self.ended[channel] = true;
        self.recording[channel].clear();
    }

    /// The checkpoints a batch of `channel` yielded now is in-flight data of (usually none).
    pub fn batch(&self, channel: usize) -> Vec<u64> {
        self.recording[channel].clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn aligned_barrier_blocks_until_every_channel_delivered_it() {
        let mut a = Aligner::new(3);
        assert_eq!(a.on_barrier(1, 5, false).unwrap(), vec![Action::Block(1)]);
        assert!(a.is_blocked(1) && !a.is_blocked(0));
        assert_eq!(a.on_barrier(0, 5, false).unwrap(), vec![Action::Block(0)]);
        assert_eq!(
            a.on_barrier(2, 5, false).unwrap(),
            vec![
                Action::Block(2),
                Action::Surface {
                    id: 5,
                    unaligned: false
                },
                Action::Resume(vec![0, 1, 2])
            ]
        );
        assert!(!a.is_blocked(1));
        assert_eq!(a.aligning(), None);
    }

    #[test]
    fn a_higher_id_aborts_the_alignment_and_starts_its_own() {
        let mut a = Aligner::new(2);
        a.on_barrier(0, 1, false).unwrap();
        assert_eq!(
            a.on_barrier(1, 2, false).unwrap(),
            vec![Action::Abort { id: 1 }, Action::Resume(vec![0]), Action::Block(1)]
        );
        // Channel 0 now delivers the abandoned id: stale, counted, and resumed.
        assert_eq!(a.on_barrier(0, 1, false).unwrap(), vec![Action::Resume(vec![0])]);
        assert_eq!(a.stale(), 1);
        assert_eq!(a.aligning(), Some(2));
    }

    #[test]
    fn an_ended_channel_is_no_longer_waited_for() {
        let mut a = Aligner::new(2);
        a.on_barrier(0, 3, false).unwrap();
        assert_eq!(
            a.on_end(1),
            vec![
                Action::Surface {
                    id: 3,
                    unaligned: false
                },
                Action::Resume(vec![0])
            ]
        );
        assert!(a.on_barrier(1, 4, false).is_err(), "a barrier after the end");
    }

    #[test]
    fn duplicates_and_mixed_kinds_are_protocol_errors() {
        let mut a = Aligner::new(2);
        a.on_barrier(0, 3, false).unwrap();
        let e = a.on_barrier(0, 3, false).unwrap_err().to_string();
        assert!(e.contains("twice"), "{e}");
        let e = a.on_barrier(1, 3, true).unwrap_err().to_string();
        assert!(e.contains("aligned and unaligned"), "{e}");
    }

    #[test]
    fn unaligned_surfaces_at_once_and_its_copies_are_not_stale() {
        let mut a = Aligner::new(3);
        a.on_barrier(2, 1, false).unwrap();
        assert_eq!(
            a.on_barrier(0, 2, true).unwrap(),
            vec![
                Action::Abort { id: 1 },
                Action::Resume(vec![2]),
                Action::Surface {
                    id: 2,
                    unaligned: true
                }
            ]
        );
        assert_eq!(a.on_barrier(1, 2, true).unwrap(), vec![]);
        assert_eq!(a.stale(), 0);
        assert_eq!(a.on_barrier(1, 1, false).unwrap(), vec![Action::Resume(vec![1])]);
        assert_eq!(a.stale(), 1);
    }

    #[test]
    fn in_flight_records_from_the_barrier_to_the_position() {
        let mut f = InFlight::new(2);
        f.ended(1);
        f.barrier(7);
        assert_eq!(f.batch(0), vec![7]);
        assert_eq!(f.batch(1), Vec::<u64>::new());
        f.position(0, 7);
        assert!(f.batch(0).is_empty());
    }

    /// What one channel's producer sends.
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Op {
        Data(u32),
        Barrier(u64),
    }

    /// A producer script: data and barriers with increasing ids (some skipped), then the end.
    fn script() -> impl Strategy<Value = Vec<Op>> {
        prop::collection::vec((any::<bool>(), 0u32..1000), 0..12).prop_map(|steps| {
            let mut id = 0;
            steps
                .into_iter()
                .map(|(barrier, x)| {
                    if barrier {
                        id += 1 + u64::from(x % 3 == 0);
                        Op::Barrier(id)
                    } else {
                        Op::Data(x)
                    }
                })
                .collect()
        })
    }

    #[derive(Debug, PartialEq)]
    enum Out {
        Data(usize, usize),
        Surface(u64),
        Abort(u64),
    }

    proptest! {
        /// Arbitrary interleavings of aligned barriers, data and ends over 1–4 channels:
        /// every data item is delivered exactly once and in channel order; every barrier id is
        /// surfaced or aborted at most once, in increasing order; no data a channel sent after
        /// barrier n comes out before n is surfaced or aborted; a surfaced n came after every
        /// channel that had not ended delivered it; and nothing deadlocks.
        #[test]
        fn alignment_state_machine(
            scripts in prop::collection::vec(script(), 1..5),
            picks in prop::collection::vec(any::<prop::sample::Index>(), 0..200),
        ) {
            let n = scripts.len();
            let mut a = Aligner::new(n);
            let mut pos = vec![0usize; n];
            let mut ended = vec![false; n];
            let mut out = Vec::new();
            let mut picks = picks.into_iter();
            // The barrier ids each channel delivered, in order, with the output index.
            let mut delivered: Vec<Vec<(u64, usize)>> = vec![Vec::new(); n];
            loop {
                let readable: Vec<usize> = (0..n).filter(|&c| !ended[c] && !a.is_blocked(c)).collect();
                if readable.is_empty() {
                    prop_assert!(ended.iter().all(|e| *e), "deadlock: {:?}", a);
                    break;
                }
                let c = match picks.next() {
                    Some(i) => readable[i.index(readable.len())],
                    None => readable[0],
                };
                let actions = if pos[c] == scripts[c].len() {
                    ended[c] = true;
                    a.on_end(c)
                } else {
                    let op = scripts[c][pos[c]];
                    pos[c] += 1;
                    match op {
                        Op::Data(_) => {
                            out.push(Out::Data(c, pos[c] - 1));
                            Vec::new()
                        }
                        Op::Barrier(id) => {
                            delivered[c].push((id, out.len()));
                            a.on_barrier(c, id, false).unwrap()
                        }
                    }
                };
                let resumed: Vec<usize> = actions.iter().flat_map(|act| match act {
                    Action::Resume(chs) => chs.clone(),
                    _ => Vec::new(),
                }).collect();
                for act in actions {
                    match act {
                        Action::Surface { id, .. } => out.push(Out::Surface(id)),
                        Action::Abort { id } => out.push(Out::Abort(id)),
                        Action::Block(ch) => prop_assert!(a.is_blocked(ch) || resumed.contains(&ch)),
                        Action::Resume(chs) => {
                            for ch in chs {
                                prop_assert!(!a.is_blocked(ch) || a.aligning().is_some());
                            }
                        }
                    }
                }
            }
            // Exactly once, in order, per channel.
            for (c, script) in scripts.iter().enumerate() {
                let got: Vec<usize> = out.iter().filter_map(|o| match o {
                    Out::Data(ch, i) if *ch == c => Some(*i),
                    _ => None,
                }).collect();
                let want: Vec<usize> = script.iter().enumerate()
                    .filter(|(_, op)| matches!(op, Op::Data(_))).map(|(i, _)| i).collect();
                prop_assert_eq!(got, want);
            }
            // Surfaced/aborted ids increase strictly.
            let ids: Vec<u64> = out.iter().filter_map(|o| match o {
                Out::Surface(id) | Out::Abort(id) => Some(*id),
                _ => None,
            }).collect();
            prop_assert!(ids.windows(2).all(|w| w[0] < w[1]), "{:?}", ids);
            for (k, o) in out.iter().enumerate() {
                let Out::Surface(id) = o else { continue };
                // Every channel delivered id before k, or never had it (its data all came out
                // before k: it ended).
                for (c, (script, deliv)) in scripts.iter().zip(&delivered).enumerate() {
                    let has = deliv.iter().any(|(b, at)| b == id && *at <= k);
                    let data_after: Vec<usize> = script.iter().enumerate()
                        .skip_while(|(_, op)| **op != Op::Barrier(*id))
                        .filter(|(_, op)| matches!(op, Op::Data(_))).map(|(i, _)| i).collect();
                    if has {
                        // No data sent after the barrier came out before it.
                        for (j, o2) in out.iter().enumerate() {
                            if let Out::Data(ch, i) = o2 {
                                if *ch == c && data_after.contains(i) {
                                    prop_assert!(j > k, "data {} of channel {} before barrier {}", i, c, id);
                                }
                            }
                        }
                    } else {
                        let last_data = out.iter().take(k).filter(|o2| matches!(o2, Out::Data(ch, _) if *ch == c)).count();
                        let total = script.iter().filter(|op| matches!(op, Op::Data(_))).count();
                        let skipped = !script.contains(&Op::Barrier(*id));
                        prop_assert!(skipped || last_data == total,
                            "barrier {} surfaced before channel {} delivered it", id, c);
                    }
                }
            }
        }
    }
}
