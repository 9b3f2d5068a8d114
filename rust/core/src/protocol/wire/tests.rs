//! Unit tests of the codec: round trips, rejections, the decoder over arbitrary chunkings.

use std::borrow::Cow;
use std::fmt;

use super::constants::*;
use super::*;
use crate::base::error::{Error, Result};
use crate::protocol::credit::{BufferHeader, Credit, DataType};

use super::samples::{hello, one_of_each};

#[test]
fn record_messages_are_rid_and_u64_and_never_zero() {
    let bytes = encoded(&Message::RecordGrant {
        receiver: ReceiverId(1),
        bytes: 0x0102,
    });
    assert_eq!(
        bytes,
        [
            26,
            0,
            0,
            0,
            b'C',
            b'F',
            b'L',
            b'W',
            PROTOCOL_VERSION,
            15,
            1,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            2,
            1,
            0,
            0,
            0,
            0,
            0,
            0
        ]
    );
    for msg in [
        Message::RecordGrant {
            receiver: ReceiverId(1),
            bytes: 0,
        },
        Message::RecordAnnouncement {
            receiver: ReceiverId(1),
            bytes: 0,
        },
    ] {
        assert!(encode(&msg, &mut Vec::new()).is_err());
    }
    let mut zero = encoded(&Message::RecordAnnouncement {
        receiver: ReceiverId(1),
        bytes: 5,
    });
    zero[18] = 0;
    assert!(decode(&zero).is_err());
    // A version 2 peer's frame is refused on its version byte.
    let mut old = encoded(&Message::CloseRequest);
    old[8] = 2;
    assert!(decode(&old).is_err());
}

fn encoded(msg: &Message<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    encode(msg, &mut out).unwrap();
    out
}

/// The error of a result that must have failed because the peer broke the format.
fn peer_error(result: Result<impl fmt::Debug, WireError>) -> WireError {
    match result {
        Err(e) if e.is_peer_fault() => e,
        other => panic!("expected the peer's error, got {other:?}"),
    }
}

#[test]
fn every_message_type_round_trips() {
    for msg in one_of_each() {
        let bytes = encoded(&msg);
        let info = check(&bytes, MAX_CONTROL_FRAME_LEN).unwrap().unwrap();
        assert_eq!(info.frame_len, bytes.len());
        assert_eq!(info.message_type, msg.message_type());
        assert_eq!(decode(&bytes).unwrap(), msg);
    }
}

#[test]
fn header_is_length_magic_version_type_little_endian() {
    let bytes = encoded(&Message::CloseRequest);
    assert_eq!(bytes, [10, 0, 0, 0, b'C', b'F', b'L', b'W', PROTOCOL_VERSION, 10]);
    let bytes = encoded(&Message::AddCredit {
        receiver: ReceiverId(1),
        credit: Credit::new(0x0102),
    });
    assert_eq!(bytes.len(), 22);
    assert_eq!(&bytes[..4], &22u32.to_le_bytes());
    assert_eq!(&bytes[10..], [1, 0, 0, 0, 0, 0, 0, 0, 2, 1, 0, 0]);
}

#[test]
fn data_header_plus_payload_equals_encoded_buffer_response() {
    let payload = b"0123456789".as_slice();
    let msg = Message::BufferResponse(BufferResponse {
        receiver: ReceiverId(42),
        sequence_number: 7,
        backlog: 3,
        payload: Payload::Data(Cow::Borrowed(payload)),
    });
    let header = BufferHeader {
        sequence_number: 7,
        backlog: 3,
        data_type: DataType::Data,
    };
    let head = encode_buffer_response_header(ReceiverId(42), header, payload.len()).unwrap();
    assert_eq!([&head[..], payload].concat(), encoded(&msg));
    let parsed = decode_buffer_response_header(&head, usize::MAX).unwrap().unwrap();
    assert_eq!(parsed.payload_len, payload.len());
    assert_eq!(parsed.credit_header(), header);
}

#[test]
fn decoded_data_payload_borrows_from_the_frame() {
    let bytes = encoded(&one_of_each()[6]);
    let Message::BufferResponse(b) = decode(&bytes).unwrap() else {
        panic!("not a BufferResponse")
    };
    let Payload::Data(Cow::Borrowed(payload)) = b.payload else {
        panic!("payload was copied")
    };
    assert_eq!(payload.as_ptr(), bytes[BUFFER_RESPONSE_HEADER_LEN..].as_ptr());
}

#[test]
fn length_over_the_limit_is_rejected_from_the_first_four_bytes() {
    assert_eq!(
        peer_error(check(&(1u32 << 31).to_le_bytes(), 32 << 10)),
        WireError::FrameTooLong {
            len: 1 << 31,
            max: 32 << 10
        }
    );
    assert_eq!(
        peer_error(check(&5u32.to_le_bytes(), 1 << 20)),
        WireError::FrameTooShort { len: 5 }
    );
}

#[test]
fn wrong_magic_is_rejected_from_its_first_byte() {
    let mut bytes = encoded(&Message::CloseRequest);
    bytes[4] = b'X';
    assert_eq!(
        peer_error(check(&bytes[..5], 100)),
        WireError::BadMagic {
            got: b"X".to_vec(),
            expected: b"C".to_vec()
        }
    );
    assert!(matches!(peer_error(decode(&bytes)), WireError::BadMagic { .. }));
}

#[test]
fn unknown_version_and_type_are_rejected() {
    let mut bytes = encoded(&Message::CloseRequest);
    // Version 1 peers count credit differently (no record body buffers).
    for version in [1, PROTOCOL_VERSION + 1] {
        bytes[8] = version;
        assert_eq!(
            peer_error(check(&bytes[..9], 100)),
            WireError::UnsupportedVersion(version)
        );
    }
    bytes[8] = PROTOCOL_VERSION;
    bytes[9] = 200;
    assert_eq!(peer_error(check(&bytes, 100)), WireError::UnknownMessageType(200));
}

#[test]
fn truncated_frame_needs_more_bytes_rather_than_failing() {
    for msg in one_of_each() {
        let bytes = encoded(&msg);
        for cut in 0..bytes.len() {
            assert_eq!(
                check(&bytes[..cut], MAX_CONTROL_FRAME_LEN).unwrap(),
                None,
                "{msg:?} cut at {cut}"
            );
        }
    }
}

#[test]
fn body_with_trailing_or_missing_bytes_is_rejected() {
    // A PartitionRequest whose frame is one byte longer than its string.
    let mut bytes = encoded(&one_of_each()[3]);
    bytes.push(0);
    let len = bytes.len() as u32;
    bytes[..4].copy_from_slice(&len.to_le_bytes());
    assert!(matches!(
        peer_error(decode(&bytes)),
        WireError::TrailingBytes { n: 1, .. }
    ));
    // ... and one byte shorter.
    bytes.truncate(bytes.len() - 2);
    let len = bytes.len() as u32;
    bytes[..4].copy_from_slice(&len.to_le_bytes());
    assert!(matches!(peer_error(decode(&bytes)), WireError::Truncated { .. }));
    // A fixed-size message with the wrong length fails from its header.
    let mut bytes = encoded(&Message::CancelPartitionRequest {
        receiver: ReceiverId(1),
    });
    bytes[0] += 1;
    assert!(matches!(
        peer_error(check(&bytes[..HEADER_LEN], 100)),
        WireError::BodyTooLong {
            ty: MessageType::CancelPartitionRequest,
            ..
        }
    ));
}

#[test]
fn frame_slice_must_match_its_declared_length() {
    let mut bytes = encoded(&Message::CloseRequest);
    bytes.push(0);
    assert_eq!(
        peer_error(decode(&bytes)),
        WireError::LengthMismatch {
            len: 11,
            declared: 10
        }
    );
}

#[test]
fn invalid_utf8_and_absurd_string_lengths_are_rejected() {
    let mut bytes = encoded(&Message::error_response(None, ErrorKind::Internal, "abc"));
    let n = bytes.len();
    bytes[n - 2] = 0xff;
    assert!(matches!(
        peer_error(decode(&bytes)),
        WireError::InvalidUtf8 {
            field: "error message",
            ..
        }
    ));
    let mut bytes = encoded(&Message::error_response(None, ErrorKind::Internal, "abc"));
    bytes[n - 7..n - 3].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(
        peer_error(decode(&bytes)),
        WireError::StringTooLong { max: 2048, .. }
    ));
}

#[test]
fn zero_credit_zero_backlog_and_bad_enums_are_rejected() {
    let bytes = encoded(&Message::AddCredit {
        receiver: ReceiverId(1),
        credit: Credit::ONE,
    });
    let mut zero = bytes.clone();
    zero[18] = 0;
    assert_eq!(
        peer_error(decode(&zero)),
        WireError::Zero {
            ty: MessageType::AddCredit,
            receiver: ReceiverId(1)
        }
    );
    assert!(matches!(
        encode(
            &Message::AddCredit {
                receiver: ReceiverId(1),
                credit: Credit::ZERO
            },
            &mut Vec::new()
        ),
        Err(WireError::ZeroToSend {
            ty: MessageType::AddCredit,
            ..
        })
    ));
    let mut bytes = encoded(&Message::Hello(hello(AuthMode::None)));
    bytes[HEADER_LEN + 9] = 9;
    assert_eq!(peer_error(decode(&bytes)), WireError::UnknownAuthMode(9));
    let mut bytes = encoded(&Message::Hello(hello(AuthMode::None)));
    bytes[HEADER_LEN + 10 + NONCE_LEN] = 2;
    assert_eq!(peer_error(decode(&bytes)), WireError::UnknownShmFlag(2));
    // No offer, but something in its place: not the bytes an encoder writes (found by the
    // frame_decoder fuzz target: re-encoding gave other bytes).
    let mut bytes = encoded(&Message::Hello(hello(AuthMode::None)));
    bytes[HEADER_LEN + 11 + NONCE_LEN] = 0x0c;
    assert_eq!(peer_error(decode(&bytes)), WireError::ShmOfferWithoutFlag);
    let mut bytes = encoded(&one_of_each()[6]);
    bytes[HEADER_LEN + 20] = 5;
    assert_eq!(peer_error(decode(&bytes)), WireError::UnknownDataType(5));
    let mut bytes = encoded(&Message::event(ReceiverId(1), 0, 0, Event::EndOfPartition));
    *bytes.last_mut().unwrap() = 9;
    assert_eq!(peer_error(decode(&bytes)), WireError::UnknownEventTag(9));
}

#[test]
fn zero_buffer_size_is_rejected_both_ways() {
    let zero = Message::NewBufferSize {
        receiver: ReceiverId(5),
        size: 0,
    };
    assert_eq!(
        encode(&zero, &mut Vec::new()),
        Err(WireError::ZeroToSend {
            ty: MessageType::NewBufferSize,
            receiver: ReceiverId(5)
        })
    );
    let mut bytes = encoded(&Message::NewBufferSize {
        receiver: ReceiverId(5),
        size: 1,
    });
    bytes[HEADER_LEN + 8] = 0;
    assert_eq!(
        peer_error(decode(&bytes)),
        WireError::Zero {
            ty: MessageType::NewBufferSize,
            receiver: ReceiverId(5)
        }
    );
    assert_eq!(MessageType::from_u8(13), Some(MessageType::NewBufferSize));
}

#[test]
fn oversized_event_is_rejected_from_its_fixed_header() {
    let head = encode_buffer_response_header(
        ReceiverId(1),
        BufferHeader {
            sequence_number: 0,
            backlog: 0,
            data_type: DataType::Event,
        },
        MAX_EVENT_LEN + 1,
    )
    .unwrap();
    assert_eq!(
        peer_error(decode_buffer_response_header(&head, usize::MAX)),
        WireError::EventTooLong(MAX_EVENT_LEN + 1)
    );
}

#[test]
fn payload_length_field_must_match_the_frame() {
    let mut bytes = encoded(&one_of_each()[6]);
    bytes[BUFFER_RESPONSE_HEADER_LEN - 4] += 1;
    assert!(matches!(
        peer_error(decode(&bytes)),
        WireError::PayloadLengthMismatch { .. }
    ));
}

#[test]
fn oversized_strings_are_refused_by_the_encoder_without_writing() {
    let mut out = vec![1, 2, 3];
    let msg = Message::PartitionRequest {
        partition_id: "p".repeat(MAX_PARTITION_ID_LEN + 1),
        subpartition: 0,
        receiver: ReceiverId(0),
        initial_credit: Credit::ZERO,
    };
    assert!(matches!(
        encode(&msg, &mut out),
        Err(WireError::TooLongToSend {
            what: "partition id",
            ..
        })
    ));
    assert_eq!(out, [1, 2, 3]);
}

#[test]
fn long_messages_are_cut_at_a_char_boundary() {
    let long = "é".repeat(MAX_MESSAGE_LEN);
    let Message::ErrorResponse { message, .. } = Message::error_response(None, ErrorKind::Internal, &long)
    else {
        unreachable!()
    };
    assert_eq!(message.len(), MAX_MESSAGE_LEN);
    let Event::ProducerFailed(m) = Event::producer_failed(&format!("x{long}")) else {
        unreachable!()
    };
    assert_eq!(m.len(), MAX_MESSAGE_LEN - 1);
}

#[test]
fn largest_control_frames_fit_the_control_limit() {
    let big = "x".repeat(MAX_MESSAGE_LEN);
    for msg in [
        Message::error_response(Some(ReceiverId(1)), ErrorKind::Internal, &big),
        Message::event(ReceiverId(1), 0, 0, Event::producer_failed(&big)),
        Message::PartitionRequest {
            partition_id: "p".repeat(MAX_PARTITION_ID_LEN),
            subpartition: 0,
            receiver: ReceiverId(0),
            initial_credit: Credit::ZERO,
        },
    ] {
        let bytes = encoded(&msg);
        assert!(check(&bytes, MAX_CONTROL_FRAME_LEN).unwrap().is_some());
    }
    assert!(max_frame_size(crate::memory::segment::MIN_SEGMENT_SIZE) >= MAX_CONTROL_FRAME_LEN);
    // Data frames: a segment, or a bulk buffer inside a record, whichever is longer.
    assert_eq!(
        max_frame_size(32 << 10),
        MAX_BULK_PAYLOAD + BUFFER_RESPONSE_HEADER_LEN
    );
    assert_eq!(max_frame_size(4 << 20), (4 << 20) + BUFFER_RESPONSE_HEADER_LEN);
}

#[test]
fn events_go_on_the_wire_as_they_are_but_a_long_failure_message_is_cut() {
    for event in [Event::EndOfPartition, Event::ProducerFailed("x".into())] {
        assert_eq!(event.to_wire(), event);
    }
    let long = "é".repeat(MAX_MESSAGE_LEN);
    let Event::ProducerFailed(cut) = Event::ProducerFailed(long.clone()).to_wire() else {
        panic!("still a ProducerFailed")
    };
    assert_eq!(cut.len(), MAX_MESSAGE_LEN);
    assert!(long.starts_with(&cut));
}

#[test]
fn decoder_yields_messages_fed_one_byte_at_a_time() {
    let msgs = one_of_each();
    let stream: Vec<u8> = msgs.iter().flat_map(encoded).collect();
    let mut decoder = Decoder::new(MAX_CONTROL_FRAME_LEN);
    let mut got = Vec::new();
    for byte in stream {
        decoder.feed(&[byte]);
        while let Some(msg) = decoder.next_message().unwrap() {
            got.push(msg.into_owned());
        }
    }
    assert_eq!(got, msgs);
    assert_eq!(decoder.buffered(), 0);
}

#[test]
fn decoder_splits_data_frames_so_payload_goes_straight_to_a_segment() {
    let payload: Vec<u8> = (0..100u8).collect();
    let data = Message::BufferResponse(BufferResponse {
        receiver: ReceiverId(3),
        sequence_number: 0,
        backlog: 1,
        payload: Payload::Data(Cow::Borrowed(&payload)),
    });
    let mut stream = encoded(&data);
    stream.extend(encoded(&Message::CloseRequest));
    let mut decoder = Decoder::new(max_frame_size(4096));
    // Header plus the first 5 payload bytes arrive together.
    decoder.feed(&stream[..BUFFER_RESPONSE_HEADER_LEN + 5]);
    let Some(Frame::DataHeader(header)) = decoder.next_frame().unwrap() else {
        panic!("expected a data header")
    };
    assert_eq!(header.payload_len, 100);
    assert_eq!(decoder.payload_remaining(), 100);
    assert_eq!(
        decoder.next_message().map(|m| m.map(Message::into_owned)),
        Err(WireError::PayloadNotTaken(100))
    );
    let mut segment = [0u8; 100];
    assert_eq!(decoder.read_payload(&mut segment), 5);
    // The transport reads the rest from the socket into the segment itself.
    segment[5..].copy_from_slice(&stream[BUFFER_RESPONSE_HEADER_LEN + 5..BUFFER_RESPONSE_HEADER_LEN + 100]);
    decoder.payload_read_elsewhere(95).unwrap();
    assert_eq!(segment.as_slice(), payload.as_slice());
    decoder.feed(&stream[BUFFER_RESPONSE_HEADER_LEN + 100..]);
    assert_eq!(
        decoder.next_frame().unwrap(),
        Some(Frame::Message(Message::CloseRequest))
    );
    assert_eq!(decoder.next_frame().unwrap(), None);
}

#[test]
fn payload_read_elsewhere_refuses_while_bytes_are_buffered() {
    let mut decoder = Decoder::new(MAX_CONTROL_FRAME_LEN);
    let head = encode_buffer_response_header(
        ReceiverId(1),
        BufferHeader {
            sequence_number: 0,
            backlog: 0,
            data_type: DataType::Data,
        },
        10,
    )
    .unwrap();
    decoder.feed(&head);
    decoder.feed(&[1, 2]);
    assert!(matches!(decoder.next_frame(), Ok(Some(Frame::DataHeader(_)))));
    assert!(decoder.payload_read_elsewhere(1).is_err());
    assert_eq!(decoder.discard_payload(), 8);
    assert!(decoder.payload_read_elsewhere(9).is_err());
    decoder.payload_read_elsewhere(8).unwrap();
    assert_eq!(decoder.next_frame().unwrap(), None);
}

#[test]
fn decoder_events_come_whole_from_next_frame() {
    let msg = Message::event(ReceiverId(1), 4, 0, Event::producer_failed("x"));
    let mut decoder = Decoder::new(MAX_CONTROL_FRAME_LEN);
    let bytes = encoded(&msg);
    decoder.feed(&bytes[..BUFFER_RESPONSE_HEADER_LEN]);
    assert_eq!(decoder.next_frame().unwrap(), None);
    decoder.feed(&bytes[BUFFER_RESPONSE_HEADER_LEN..]);
    assert_eq!(decoder.next_frame().unwrap(), Some(Frame::Message(msg)));
}

#[test]
fn decoder_stays_failed_after_a_protocol_error() {
    let mut decoder = Decoder::new(100);
    decoder.feed(&(1u32 << 31).to_le_bytes());
    let first = WireError::FrameTooLong {
        len: 1 << 31,
        max: 100,
    };
    assert_eq!(peer_error(decoder.next_message()), first);
    decoder.feed(&encoded(&Message::CloseRequest));
    assert_eq!(
        peer_error(decoder.next_frame()),
        WireError::StreamFailed(Box::new(first))
    );
}

#[test]
fn decoder_reads_in_place_and_reuses_its_buffer() {
    let bytes = encoded(&Message::CloseRequest);
    let mut decoder = Decoder::new(100);
    for _ in 0..1000 {
        let dst = decoder.read_buf(64);
        dst[..bytes.len()].copy_from_slice(&bytes);
        decoder.commit(bytes.len());
        assert_eq!(decoder.next_message().unwrap(), Some(Message::CloseRequest));
    }
    assert!(decoder.buf.len() <= 64);
}

#[test]
fn wire_errors_keep_their_text_upward_as_protocol_or_invalid_argument() {
    let peer = WireError::FrameTooLong { len: 200, max: 100 };
    assert_eq!(
        peer.to_string(),
        "frame length 200 exceeds the maximum frame size 100"
    );
    assert!(
        matches!(Error::from(peer), Error::Protocol(m) if m == "frame length 200 exceeds the maximum frame size 100")
    );
    let magic = WireError::BadMagic {
        got: vec![0x58],
        expected: vec![0x43],
    };
    assert_eq!(magic.to_string(), "bad magic [58], expected [43] (\"CFLW\")");
    let caller = WireError::ZeroToSend {
        ty: MessageType::AddCredit,
        receiver: ReceiverId(3),
    };
    assert!(!caller.is_peer_fault());
    assert!(
        matches!(Error::from(caller), Error::InvalidArgument(m) if m == "AddCredit of zero for receiver 3")
    );
}
