//! The host service's attach protocol (`host::codec`) over arbitrary bytes: what a task and
//! its service read from each other on a session or a link.
//!
//! Input: a frame type byte, then a frame's body. Every decoder that may meet that frame type
//! reads the body (the openings, the service's welcome, requests, replies, a link's signals
//! and record heads, whatever the type says, since a peer with a bug may send any of them).
//! The first five bytes also go through the frame header's check.
//!
//! Checked: nothing panics; the header is accepted exactly when its length is in bounds; a
//! message a decoder accepts re-encodes to a frame whose header says its length and which
//! decodes to the same message, with exactly the body it came from (the encoding is
//! canonical), except for messages that carry an error, whose re-encoding must be stable from
//! the first trip on (some errors carry a fixed string, chosen from a list when decoded).

use std::fmt::Debug;

use crate::base::error::Result;
use crate::host::codec::{self, In, Opening, RecordHead, Reply, Request, Signal, Welcome, FRAME_HEADER};

/// Runs one input; panics if a check fails.
pub fn run(data: &[u8]) {
    if let Ok(h) = <[u8; FRAME_HEADER]>::try_from(data.get(..FRAME_HEADER).unwrap_or(&[])) {
        let len = u32::from_le_bytes(h[..4].try_into().expect("4 bytes")) as usize;
        let max = 1 << 16;
        let ok = (FRAME_HEADER..=max).contains(&len);
        assert_eq!(codec::header(h, max).is_ok(), ok, "header {h:?}");
    }
    let Some((&ty, body)) = data.split_first() else {
        return;
    };
    check(
        body,
        Opening::decode(ty, body),
        Opening::encode,
        Opening::decode,
        true,
    );
    check(
        body,
        Welcome::decode(body),
        Welcome::encode,
        |_, b| Welcome::decode(b),
        true,
    );
    check(
        body,
        Request::decode(body),
        |(id, r)| r.encode(*id),
        |_, b| Request::decode(b),
        true,
    );
    if let Ok(reply) = Reply::decode(body) {
        let exact = !matches!(reply.1, Reply::Failed(_));
        check(
            body,
            Ok(reply),
            |(id, r)| r.encode(*id),
            |_, b| Reply::decode(b),
            exact,
        );
    }
    if let Ok(signal) = Signal::decode(ty, body) {
        let exact = !matches!(signal, Signal::Error(_));
        check(body, Ok(signal), Signal::encode, Signal::decode, exact);
    }
    check(
        body,
        RecordHead::decode_item(body),
        |(h, start, len)| h.item(*start, *len),
        |_, b| RecordHead::decode_item(b),
        true,
    );
    check(
        body,
        RecordHead::decode_item(body),
        |(h, start, len)| h.piece_item(*start, *len),
        |_, b| RecordHead::decode_item(b),
        true,
    );
    check(
        body,
        RecordHead::decode_forward(body),
        |(h, piece)| h.forward(piece),
        |_, b| RecordHead::decode_forward(b),
        true,
    );
    let mut i = In::new(body);
    if let Ok(head) = RecordHead::decode_inline(&mut i) {
        let record = i.rest();
        for (mut again, ty) in [
            (head.inline(record.len()), codec::ty::RECORD),
            (head.piece(record.len()), codec::ty::PIECE),
        ] {
            again.extend_from_slice(record);
            let (len, t) = codec::header(again[..FRAME_HEADER].try_into().expect("a header"), usize::MAX)
                .expect("a record frame's header is in bounds");
            assert_eq!((len, t), (again.len(), ty));
            assert_eq!(
                &again[FRAME_HEADER..],
                body,
                "an inline record head re-encodes as it came"
            );
        }
    }
}

/// If `decoded` is a message: its frame (`encode`) has a header that says its length, and
/// decodes (`decode`, given the frame's type and body) to the same message; `exact`: the
/// frame's body is `body`.
fn check<T: Debug>(
    body: &[u8],
    decoded: Result<T>,
    encode: impl Fn(&T) -> Vec<u8>,
    decode: impl Fn(u8, &[u8]) -> Result<T>,
    exact: bool,
) {
    let Ok(message) = decoded else { return };
    let frame = encode(&message);
    let (len, t) = codec::header(frame[..FRAME_HEADER].try_into().expect("a header"), usize::MAX)
        .expect("an encoded frame's header is in bounds");
    assert_eq!(
        len,
        frame.len(),
        "{message:?}: the header says the frame's length"
    );
    let again = decode(t, &frame[FRAME_HEADER..]).unwrap_or_else(|e| panic!("{message:?} re-encoded: {e}"));
    if exact {
        assert_eq!(
            &frame[FRAME_HEADER..],
            body,
            "{message:?} re-encodes to other bytes"
        );
        assert_eq!(format!("{again:?}"), format!("{message:?}"));
    } else {
        // Stable from the first trip on.
        let second = encode(&again);
        assert_eq!(second, frame, "{message:?} changes on a second trip");
    }
}

/// Inputs built from the current protocol: one valid frame of every message (type byte and
/// body), from which the fuzzer starts.
pub fn seeds() -> Vec<Vec<u8>> {
    codec::samples()
        .into_iter()
        .map(|frame| {
            let mut input = vec![frame[4]];
            input.extend_from_slice(&frame[FRAME_HEADER..]);
            input
        })
        .collect()
}
