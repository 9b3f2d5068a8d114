//! Properties of the wire codec (`creditflow_core::transport`): round trips, arbitrary
//! chunkings, arbitrary garbage, and no allocation driven by a declared frame length.
//!
//! The tests live in `mod transport` so `cargo test -p creditflow-core transport` runs them.

mod support;

use support::alloc::CountingAlloc;

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

mod transport {
    use std::borrow::Cow;

    use creditflow_core::protocol::credit::Credit;
    use creditflow_core::protocol::wire::*;
    use creditflow_core::protocol::wire::{MAX_MESSAGE_LEN, MAX_PARTITION_ID_LEN, PROTOCOL_VERSION};
    use proptest::prelude::*;

    use super::support::alloc::allocated_by;

    // -----------------------------------------------------------------------------------------
    // Strategies
    // -----------------------------------------------------------------------------------------

    fn receiver() -> impl Strategy<Value = ReceiverId> {
        any::<u64>().prop_map(ReceiverId)
    }

    fn text(max_bytes: usize) -> impl Strategy<Value = String> {
        prop_oneof![
            4 => "\\PC{0,40}",
            1 => Just("ß".repeat(max_bytes / 2)),
        ]
    }

    fn hello() -> impl Strategy<Value = Hello> {
        (
            any::<u8>(),
            any::<u32>(),
            any::<u32>(),
            prop_oneof![Just(AuthMode::None), Just(AuthMode::HmacSha256)],
            any::<[u8; 32]>(),
            proptest::option::of((any::<[u8; 16]>(), any::<u32>(), any::<u32>(), any::<u64>())),
        )
            .prop_map(
                |(version, segment_size, max_frame_size, auth, nonce, shm)| Hello {
                    version,
                    segment_size,
                    max_frame_size,
                    auth,
                    nonce,
                    shm: shm.map(|(boot_id, uid, pid, key)| ShmOffer {
                        boot_id,
                        uid,
                        pid,
                        key,
                    }),
                },
            )
    }

    fn error_kind() -> impl Strategy<Value = ErrorKind> {
        prop_oneof![
            Just(ErrorKind::Internal),
            Just(ErrorKind::Protocol),
            Just(ErrorKind::Authentication),
            Just(ErrorKind::ProducerFailed),
            Just(ErrorKind::SubpartitionOutOfRange),
            Just(ErrorKind::AlreadyConsumed),
            Just(ErrorKind::LimitExceeded),
        ]
    }

    fn payload() -> impl Strategy<Value = Payload<'static>> {
        prop_oneof![
            prop::collection::vec(any::<u8>(), 0..300).prop_map(|v| Payload::Data(Cow::Owned(v))),
            Just(Payload::Event(Event::EndOfPartition)),
            text(MAX_MESSAGE_LEN).prop_map(|m| Payload::Event(Event::ProducerFailed(m))),
            prop::collection::vec(any::<u8>(), 0..300).prop_map(|v| Payload::Event(Event::User(v))),
            (any::<u64>(), any::<bool>())
                .prop_map(|(id, unaligned)| Payload::Event(Event::Barrier { id, unaligned })),
            any::<u64>().prop_map(|id| Payload::Event(Event::BarrierPosition(id))),
        ]
    }

    fn message() -> impl Strategy<Value = Message<'static>> {
        prop_oneof![
            hello().prop_map(Message::Hello),
            (hello(), any::<[u8; 32]>()).prop_map(|(hello, tag)| Message::HelloAck { hello, tag }),
            any::<[u8; 32]>().prop_map(|tag| Message::AuthProof { tag }),
            (text(MAX_PARTITION_ID_LEN), any::<u32>(), receiver(), any::<u32>()).prop_map(
                |(partition_id, subpartition, receiver, credit)| Message::PartitionRequest {
                    partition_id,
                    subpartition,
                    receiver,
                    initial_credit: Credit::new(credit),
                }
            ),
            (receiver(), 1..=u32::MAX).prop_map(|(receiver, c)| Message::AddCredit {
                receiver,
                credit: Credit::new(c)
            }),
            (receiver(), 1..=u32::MAX)
                .prop_map(|(receiver, backlog)| Message::BacklogAnnouncement { receiver, backlog }),
            (receiver(), any::<u64>(), any::<u32>(), payload()).prop_map(
                |(receiver, sequence_number, backlog, payload)| Message::BufferResponse(BufferResponse {
                    receiver,
                    sequence_number,
                    backlog,
                    payload,
                })
            ),
            (prop::option::of(receiver()), error_kind(), text(MAX_MESSAGE_LEN)).prop_map(
                |(receiver, kind, message)| Message::ErrorResponse {
                    receiver,
                    kind,
                    message,
                }
            ),
            receiver().prop_map(|receiver| Message::CancelPartitionRequest { receiver }),
            Just(Message::CloseRequest),
            receiver().prop_map(|receiver| Message::PartitionNotFound { receiver }),
            receiver().prop_map(|receiver| Message::ResumeConsumption { receiver }),
            (receiver(), 1..=u32::MAX).prop_map(|(receiver, size)| Message::NewBufferSize { receiver, size }),
        ]
    }

    // -----------------------------------------------------------------------------------------
    // Helpers
    // -----------------------------------------------------------------------------------------

    const LIMIT: usize = 4096 + BUFFER_RESPONSE_HEADER_LEN;

    fn encode_all(msgs: &[Message<'_>]) -> Vec<u8> {
        let mut out = Vec::new();
        for msg in msgs {
            encode(msg, &mut out).unwrap();
        }
        out
    }

    /// A data BufferResponse being reassembled from a split frame.
    type Pending = Option<(BufferResponseHeader, Vec<u8>)>;

    /// Takes everything the decoder can give now. In split mode data payloads are taken
    /// through `read_payload`, as the transport would into a segment.
    fn drain(
        dec: &mut Decoder,
        split: bool,
        pending: &mut Pending,
        out: &mut Vec<Message<'static>>,
    ) -> Result<(), WireError> {
        loop {
            if let Some((header, mut bytes)) = pending.take() {
                let mut segment = vec![0u8; dec.payload_remaining()];
                let n = dec.read_payload(&mut segment);
                bytes.extend_from_slice(&segment[..n]);
                if dec.payload_remaining() > 0 {
                    *pending = Some((header, bytes));
                    return Ok(());
                }
                assert_eq!(bytes.len(), header.payload_len);
                out.push(Message::BufferResponse(BufferResponse {
                    receiver: header.receiver,
                    sequence_number: header.sequence_number,
                    backlog: header.backlog,
                    payload: Payload::Data(Cow::Owned(bytes)),
                }));
            }
            if split {
                match dec.next_frame()? {
                    None => return Ok(()),
                    Some(Frame::Message(m)) => out.push(m.into_owned()),
                    Some(Frame::DataHeader(h)) => *pending = Some((h, Vec::new())),
                }
            } else {
                match dec.next_message()? {
                    None => return Ok(()),
                    Some(m) => out.push(m.into_owned()),
                }
            }
        }
    }

    /// Feeds `stream` in chunks of the given sizes (cycled), draining after each.
    fn decode_chunked(
        stream: &[u8],
        chunks: &[usize],
        split: bool,
        max_frame: usize,
    ) -> Result<Vec<Message<'static>>, WireError> {
        let mut dec = Decoder::new(max_frame);
        let mut pending = None;
        let mut out = Vec::new();
        let mut rest = stream;
        let mut sizes = chunks.iter().cycle();
        while !rest.is_empty() {
            let n = (*sizes.next().unwrap()).clamp(1, rest.len());
            dec.feed(&rest[..n]);
            rest = &rest[n..];
            drain(&mut dec, split, &mut pending, &mut out)?;
        }
        Ok(out)
    }

    fn assert_protocol_or_ok<T: std::fmt::Debug>(result: &Result<T, WireError>) {
        assert!(
            result.as_ref().err().is_none_or(WireError::is_peer_fault),
            "expected messages, need-more-bytes or the peer's error, got {result:?}"
        );
    }

    // -----------------------------------------------------------------------------------------
    // Scenarios
    // -----------------------------------------------------------------------------------------

    #[test]
    fn declared_length_of_2_pow_31_is_rejected_from_the_header_alone_without_allocating() {
        let mut header = Vec::new();
        header.extend_from_slice(&(1u32 << 31).to_le_bytes());
        header.extend_from_slice(b"CFLW");
        header.extend_from_slice(&[PROTOCOL_VERSION, 7]);
        let mut dec = Decoder::new(LIMIT);
        dec.read_buf(64);
        for end in 4..=header.len() {
            let (result, bytes) = allocated_by(|| check(&header[..end], LIMIT));
            assert_eq!(
                result,
                Err(WireError::FrameTooLong {
                    len: 1 << 31,
                    max: LIMIT
                })
            );
            assert!(bytes < 256, "{bytes} bytes allocated");
        }
        // The decoder fails as soon as the 4 length bytes are in; nothing else arrives.
        dec.feed(&header[..4]);
        let (result, bytes) = allocated_by(|| dec.next_frame().map(|f| f.is_some()));
        assert!(
            matches!(result, Err(WireError::FrameTooLong { .. })),
            "{result:?}"
        );
        assert!(bytes < 256, "{bytes} bytes allocated");
        assert_eq!(dec.buffered(), 4);
    }

    #[test]
    fn check_never_allocates_while_waiting_or_on_success() {
        let stream = encode_all(&[
            Message::CloseRequest,
            Message::error_response(None, ErrorKind::Internal, "x"),
            Message::event(ReceiverId(1), 0, 0, Event::EndOfPartition),
        ]);
        for end in 0..=stream.len() {
            let (result, bytes) = allocated_by(|| check(&stream[..end], LIMIT));
            assert!(result.is_ok());
            assert_eq!(bytes, 0, "check of {end} bytes allocated");
        }
    }

    #[test]
    fn decoder_buffer_grows_with_bytes_fed_not_with_declared_lengths() {
        let mut stream = Vec::new();
        let head = encode_buffer_response_header(
            ReceiverId(1),
            creditflow_core::protocol::credit::BufferHeader {
                sequence_number: 0,
                backlog: 0,
                data_type: creditflow_core::protocol::credit::DataType::Data,
            },
            4096,
        )
        .unwrap();
        stream.extend_from_slice(&head);
        let mut dec = Decoder::new(LIMIT);
        let (result, bytes) = allocated_by(|| {
            dec.feed(&stream);
            dec.next_message().map(|m| m.is_some())
        });
        assert!(matches!(result, Ok(false)));
        assert!(bytes < 256, "{bytes} bytes allocated for a 35-byte header");
    }

    #[test]
    fn wrong_magic_is_rejected() {
        let mut stream = encode_all(&[Message::CloseRequest]);
        stream[6] ^= 0xff;
        let result = decode_chunked(&stream, &[1], false, LIMIT);
        assert!(matches!(&result, Err(WireError::BadMagic { .. })), "{result:?}");
    }

    #[test]
    fn truncated_frame_reports_need_more_bytes_not_an_error() {
        let stream = encode_all(&[Message::error_response(
            Some(ReceiverId(9)),
            ErrorKind::Protocol,
            "gap",
        )]);
        let mut dec = Decoder::new(LIMIT);
        dec.feed(&stream[..stream.len() - 1]);
        assert_eq!(dec.next_message().unwrap(), None);
        assert_eq!(dec.next_frame().unwrap(), None);
        dec.feed(&stream[stream.len() - 1..]);
        assert!(dec.next_message().unwrap().is_some());
    }

    #[test]
    fn concatenated_frames_split_at_every_boundary_decode_identically() {
        let msgs = vec![
            Message::Hello(Hello {
                version: PROTOCOL_VERSION,
                segment_size: 4096,
                max_frame_size: LIMIT as u32,
                auth: AuthMode::HmacSha256,
                nonce: [3; 32],
                shm: None,
            }),
            Message::PartitionRequest {
                partition_id: "p-1".into(),
                subpartition: 2,
                receiver: ReceiverId(5),
                initial_credit: Credit::new(2),
            },
            Message::BufferResponse(BufferResponse {
                receiver: ReceiverId(5),
                sequence_number: 0,
                backlog: 1,
                payload: Payload::Data(Cow::Owned((0..=255).collect())),
            }),
            Message::AddCredit {
                receiver: ReceiverId(5),
                credit: Credit::ONE,
            },
            Message::BufferResponse(BufferResponse {
                receiver: ReceiverId(5),
                sequence_number: 1,
                backlog: 0,
                payload: Payload::Data(Cow::Owned(Vec::new())),
            }),
            Message::event(ReceiverId(5), 2, 0, Event::EndOfPartition),
            Message::CloseRequest,
        ];
        let stream = encode_all(&msgs);
        for split in [false, true] {
            for at in 0..=stream.len() {
                let mut dec = Decoder::new(LIMIT);
                let mut pending = None;
                let mut out = Vec::new();
                dec.feed(&stream[..at]);
                drain(&mut dec, split, &mut pending, &mut out).unwrap();
                dec.feed(&stream[at..]);
                drain(&mut dec, split, &mut pending, &mut out).unwrap();
                assert_eq!(out, msgs, "split mode {split}, cut at {at}");
                assert!(pending.is_none());
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn arbitrary_message_round_trips(msg in message()) {
            let mut bytes = Vec::new();
            encode(&msg, &mut bytes).unwrap();
            let info = check(&bytes, usize::MAX).unwrap().unwrap();
            prop_assert_eq!(info.frame_len, bytes.len());
            prop_assert_eq!(info.message_type, msg.message_type());
            prop_assert_eq!(decode(&bytes).unwrap(), msg);
        }

        #[test]
        fn arbitrary_messages_survive_arbitrary_chunkings(
            msgs in prop::collection::vec(message(), 1..8),
            chunks in prop::collection::vec(1usize..64, 1..10),
            split in any::<bool>(),
        ) {
            let stream = encode_all(&msgs);
            prop_assert_eq!(decode_chunked(&stream, &chunks, split, usize::MAX).unwrap(), msgs);
        }

        /// The fuzz target's harness (transport-style reads: `read_buf`/`commit`, payloads
        /// read into a segment or skipped with `payload_read_elsewhere`) on valid streams
        /// with a garbage tail: same messages as a one-shot decode, canonical re-encoding.
        #[test]
        fn transport_style_reads_of_valid_streams_match_one_shot_decoding(
            mode in 0u8..8,
            sizes in prop::collection::vec(1u16..5000, 1..8),
            msgs in prop::collection::vec(message(), 0..12),
            tail in prop::collection::vec(any::<u8>(), 0..48),
        ) {
            let mut data = vec![mode, (sizes.len() - 1) as u8];
            for s in &sizes {
                data.extend_from_slice(&s.to_le_bytes());
            }
            data.extend(encode_all(&msgs));
            data.extend(tail);
            creditflow_core::fuzz::frames::run(&data);
        }

        #[test]
        fn arbitrary_bytes_never_panic_and_fail_only_with_protocol_errors(
            bytes in prop::collection::vec(any::<u8>(), 0..400),
            chunks in prop::collection::vec(1usize..40, 1..10),
            split in any::<bool>(),
            max_frame in 0usize..5000,
        ) {
            assert_protocol_or_ok(&decode_chunked(&bytes, &chunks, split, max_frame));
            assert_protocol_or_ok(&decode(&bytes));
            assert_protocol_or_ok(&check(&bytes, max_frame));
        }

        #[test]
        fn corrupted_valid_streams_never_panic_and_fail_only_with_protocol_errors(
            msgs in prop::collection::vec(message(), 1..5),
            flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
            chunks in prop::collection::vec(1usize..40, 1..10),
            split in any::<bool>(),
        ) {
            let mut stream = encode_all(&msgs);
            for (at, byte) in flips {
                let i = at.index(stream.len());
                stream[i] = byte;
            }
            assert_protocol_or_ok(&decode_chunked(&stream, &chunks, split, LIMIT));
        }
    }
}
