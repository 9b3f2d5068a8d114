//! Sample messages: one of every type, with the extremes of their fields. The codec's unit
//! tests round-trip them and the fuzz harness builds its seed inputs from them (so the seeds
//! follow the wire format wherever it goes).

use std::borrow::Cow;

use super::constants::*;
use super::*;
use crate::base::event::Event;
use crate::protocol::credit::Credit;

/// A Hello as an environment with 32 KiB segments and no shared memory sends it.
pub fn hello(auth: AuthMode) -> Hello {
    Hello {
        version: PROTOCOL_VERSION,
        segment_size: 32 << 10,
        max_frame_size: max_frame_size(32 << 10) as u32,
        auth,
        nonce: std::array::from_fn(|i| i as u8),
        shm: None,
    }
}

/// One message of every type, events of every kind, and the extremes of their fields.
pub fn one_of_each() -> Vec<Message<'static>> {
    let r = ReceiverId(0x0102_0304_0506_0708);
    vec![
        Message::Hello(hello(AuthMode::None)),
        Message::HelloAck {
            hello: Hello {
                shm: Some(ShmOffer {
                    boot_id: [0x5a; 16],
                    uid: 1000,
                    pid: 4242,
                    key: 0x0102_0304_0506_0708,
                }),
                ..hello(AuthMode::HmacSha256)
            },
            tag: [0xab; TAG_LEN],
        },
        Message::AuthProof { tag: [7; TAG_LEN] },
        Message::PartitionRequest {
            partition_id: "stage-3/map-7 ✓".into(),
            subpartition: 5,
            receiver: r,
            initial_credit: Credit::new(2),
        },
        Message::AddCredit {
            receiver: r,
            credit: Credit::new(3),
        },
        Message::BacklogAnnouncement {
            receiver: r,
            backlog: 9,
        },
        Message::BufferResponse(BufferResponse {
            receiver: r,
            sequence_number: u64::MAX,
            backlog: 4,
            payload: Payload::Data(Cow::Owned(b"arrow ipc bytes".to_vec())),
        }),
        Message::event(r, 0, 0, Event::EndOfPartition),
        Message::event(r, 1, 2, Event::producer_failed("writer interrupted")),
        Message::error_response(Some(r), ErrorKind::ProducerFailed, "boom"),
        Message::error_response(None, ErrorKind::Authentication, "bad HMAC"),
        Message::CancelPartitionRequest { receiver: r },
        Message::CloseRequest,
        Message::PartitionNotFound { receiver: r },
        Message::ResumeConsumption { receiver: r },
        Message::event(r, 2, 0, Event::User(b"watermark 17".to_vec())),
        Message::event(r, 3, 0, Event::User(vec![7; MAX_EVENT_PAYLOAD_LEN])),
        Message::event(
            r,
            4,
            1,
            Event::Barrier {
                id: 9,
                unaligned: false,
            },
        ),
        Message::event(
            r,
            5,
            1,
            Event::Barrier {
                id: u64::MAX,
                unaligned: true,
            },
        ),
        Message::event(r, 6, 0, Event::BarrierPosition(u64::MAX)),
        Message::NewBufferSize {
            receiver: r,
            size: 4096,
        },
        Message::RecordAnnouncement {
            receiver: r,
            bytes: 48_000_000,
        },
        Message::RecordGrant {
            receiver: r,
            bytes: u64::MAX,
        },
        Message::SharedBuffer(SharedBuffer {
            receiver: r,
            sequence_number: 8,
            backlog: 3,
            item: 65_592,
            item_len: 1_827_930,
            offset: 32_768,
            len: 32_768,
        }),
    ]
}
