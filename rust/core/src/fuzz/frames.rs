//! The frame decoder over arbitrary bytes in arbitrary chunks.
//!
//! Input: a mode byte (bit 0: split data frames as the transport does, header first and the
//! payload read into a "segment" or skipped; bit 1: after the handshake, frames up to a
//! 4 KiB segment, else only control frames; bit 2: skip data payloads instead of reading
//! them), a count byte and that many chunk sizes (u16, cycled; 0 means 1), then the stream.
//!
//! Checked: the chunked decode gives exactly the messages of a one-shot decode of the whole
//! stream, in order, and fails where it fails; every error is the peer's
//! ([`WireError::is_peer_fault`]); the
//! messages re-encode to exactly the bytes they came from (the encoding is canonical); no
//! frame over the limit is accepted.

use std::borrow::Cow;

use super::Bytes;
use crate::protocol::wire::{
    encode, max_frame_size, samples, BufferResponse, Decoder, Frame, Message, Payload, WireError,
    BUFFER_RESPONSE_HEADER_LEN, MAX_CONTROL_FRAME_LEN,
};

/// Segment size after the "handshake".
const SEGMENT: usize = 4096;
/// What the transport asks `read_buf` for.
const READ_CHUNK: usize = 4096;

/// What one decode produced: the messages, and whether it stopped at a protocol error.
#[derive(Debug, PartialEq)]
struct Outcome {
    messages: Vec<Message<'static>>,
    failed: bool,
}

/// The one-shot decode, and whether it ended inside a frame (waiting for more bytes).
struct Reference {
    outcome: Outcome,
    incomplete: bool,
}

fn protocol_only(e: WireError) -> bool {
    assert!(e.is_peer_fault(), "a decoder error that is not the peer's: {e:?}");
    true
}

/// The whole stream fed at once, whole messages only.
fn one_shot(stream: &[u8], limit: usize) -> Reference {
    let mut dec = Decoder::new(limit);
    dec.feed(stream);
    let mut messages = Vec::new();
    loop {
        match dec.next_message() {
            Ok(Some(m)) => messages.push(m.into_owned()),
            Ok(None) => {
                return Reference {
                    outcome: Outcome {
                        messages,
                        failed: false,
                    },
                    incomplete: dec.buffered() > 0,
                }
            }
            Err(e) => {
                return Reference {
                    outcome: Outcome {
                        messages,
                        failed: protocol_only(e),
                    },
                    incomplete: false,
                }
            }
        }
    }
}

/// A socket that returns the stream in the given chunk sizes.
struct Socket<'a> {
    rest: &'a [u8],
    sizes: Vec<usize>,
    next: usize,
}

impl Socket<'_> {
    /// Reads at most one chunk into `dst`; 0 at the end.
    fn read(&mut self, dst: &mut [u8]) -> usize {
        let size = self.sizes[self.next % self.sizes.len()];
        self.next += 1;
        let n = size.min(dst.len()).min(self.rest.len());
        dst[..n].copy_from_slice(&self.rest[..n]);
        self.rest = &self.rest[n..];
        n
    }
}

/// The stream read the way `FrameReader` reads a socket: into the decoder's buffer, and in
/// split mode data payloads partly from the buffer, the rest straight from the socket.
fn chunked(sock: &mut Socket<'_>, limit: usize, split: bool, skip: bool) -> Outcome {
    let mut dec = Decoder::new(limit);
    let mut messages = Vec::new();
    loop {
        let next = if split {
            dec.next_frame().map(|f| {
                f.map(|f| match f {
                    Frame::Message(m) => Ok(m.into_owned()),
                    Frame::DataHeader(h) => Err(h),
                })
            })
        } else {
            dec.next_message().map(|m| m.map(|m| Ok(m.into_owned())))
        };
        match next {
            Err(e) => {
                return Outcome {
                    messages,
                    failed: protocol_only(e),
                }
            }
            Ok(Some(Ok(m))) => {
                assert!(
                    !matches!(&m, Message::BufferResponse(b) if matches!(b.payload, Payload::Data(_)) && split)
                );
                messages.push(m);
            }
            Ok(Some(Err(header))) => {
                // The decoder bounds a data payload by the frame limit (control frames, and
                // so events, may be longer than a small segment); the receiver refuses a data
                // payload longer than its segment itself (scripted_peer's
                // server_faults::oversized_frame_is_a_protocol_error).
                assert!(
                    header.payload_len + BUFFER_RESPONSE_HEADER_LEN <= limit,
                    "a payload over the frame limit was accepted"
                );
                let mut segment = vec![0u8; header.payload_len];
                let mut done = if skip { 0 } else { dec.read_payload(&mut segment) };
                if skip {
                    dec.discard_payload();
                }
                while dec.payload_remaining() > 0 {
                    let want = dec.payload_remaining();
                    // Not skipping, one read also takes what follows the payload into the
                    // decoder, as `FrameReader::read_payload_into`'s two-buffer read does.
                    let behind = if skip { 0 } else { READ_CHUNK };
                    let mut scratch = vec![0u8; want + behind];
                    let got = sock.read(&mut scratch);
                    let n = got.min(want);
                    if n == 0 {
                        // The stream ends inside the payload: the one-shot decode never
                        // completes this frame either.
                        return Outcome {
                            messages,
                            failed: false,
                        };
                    }
                    dec.payload_read_elsewhere(n)
                        .expect("within the payload, nothing buffered");
                    if !skip {
                        segment[done..done + n].copy_from_slice(&scratch[..n]);
                        done += n;
                    }
                    dec.feed(&scratch[n..got]);
                }
                let payload = if skip {
                    // Skipped bytes are not known here; compare the header only (below).
                    Cow::Owned(Vec::new())
                } else {
                    Cow::Owned(segment)
                };
                messages.push(Message::BufferResponse(BufferResponse {
                    receiver: header.receiver,
                    sequence_number: header.sequence_number,
                    backlog: header.backlog,
                    payload: Payload::Data(payload),
                }));
            }
            Ok(None) => {
                let buf = dec.read_buf(READ_CHUNK);
                let n = sock.read(buf);
                if n == 0 {
                    return Outcome {
                        messages,
                        failed: false,
                    };
                }
                dec.commit(n);
            }
        }
    }
}

/// Blanks data payloads (for comparison with a run that skipped them).
fn without_payloads(messages: &[Message<'static>]) -> Vec<Message<'static>> {
    messages
        .iter()
        .map(|m| match m {
            Message::BufferResponse(b) if matches!(b.payload, Payload::Data(_)) => {
                Message::BufferResponse(BufferResponse {
                    payload: Payload::Data(Cow::Owned(Vec::new())),
                    ..b.clone()
                })
            }
            other => other.clone(),
        })
        .collect()
}

/// Runs one scenario (see the module docs); panics on a broken invariant.
pub fn run(data: &[u8]) {
    let mut input = Bytes::new(data);
    let mode = input.u8().unwrap_or(0);
    let (split, handshaken, skip) = (mode & 1 != 0, mode & 2 != 0, mode & 4 != 0);
    let count = input.u8().unwrap_or(0) % 8 + 1;
    let sizes: Vec<usize> = (0..count)
        .map(|_| usize::from(input.u16().unwrap_or(1)).max(1))
        .collect();
    let stream = input.rest();
    let limit = if handshaken {
        max_frame_size(SEGMENT)
    } else {
        MAX_CONTROL_FRAME_LEN
    };

    let Reference {
        outcome: reference,
        incomplete,
    } = one_shot(stream, limit);
    // Canonical: the messages are exactly the bytes they were decoded from.
    let mut reencoded = Vec::new();
    for m in &reference.messages {
        let before = reencoded.len();
        encode(m, &mut reencoded).expect("a decoded message encodes");
        assert!(
            reencoded.len() - before <= limit,
            "a frame over the limit was accepted"
        );
    }
    assert!(
        stream.starts_with(&reencoded),
        "re-encoding the decoded messages does not give back the stream"
    );

    let mut sock = Socket {
        rest: stream,
        sizes,
        next: 0,
    };
    let got = chunked(&mut sock, limit, split, split && skip);
    if split && skip {
        assert_eq!(
            without_payloads(&got.messages),
            without_payloads(&reference.messages)
        );
    } else {
        assert_eq!(got.messages, reference.messages);
    }
    if got.failed != reference.failed {
        // Split mode checks a data frame's declared length against its header as soon as
        // the header is in; a one-shot decode of a stream that ends inside that frame is
        // still waiting for the rest. No other difference is allowed.
        assert!(
            split && got.failed && incomplete,
            "chunked failed: {}, one-shot failed: {}",
            got.failed,
            reference.failed
        );
    }
}

/// Seed inputs for the fuzzer (and regression inputs for the corpus replay), built with the
/// encoder from one message of every type ([`samples::one_of_each`]), so they follow the
/// wire format: every mode under four chunkings, over the stream of every message that fits
/// a handshaken frame and over a large data frame followed by the stream's start; then each
/// message alone, handshaken, in two chunkings.
pub fn seeds() -> Vec<Vec<u8>> {
    let limit = max_frame_size(SEGMENT);
    let frames: Vec<Vec<u8>> = samples::one_of_each()
        .iter()
        .map(|m| {
            let mut b = Vec::new();
            encode(m, &mut b).expect("a sample message encodes");
            b
        })
        .collect();
    let stream: Vec<u8> = frames
        .iter()
        .filter(|f| f.len() <= limit)
        .flatten()
        .copied()
        .collect();
    let mut big = Vec::new();
    let data = Message::BufferResponse(BufferResponse {
        receiver: crate::protocol::wire::ReceiverId(9),
        sequence_number: 0,
        backlog: 0,
        payload: Payload::Data(Cow::Owned(vec![0; SEGMENT])),
    });
    encode(&data, &mut big).expect("a data frame encodes");
    big.extend_from_slice(&stream[..stream.len().min(200)]);
    let prefix = |mode: u8, sizes: &[u16]| -> Vec<u8> {
        let mut p = vec![mode, (sizes.len() - 1) as u8];
        for s in sizes {
            p.extend_from_slice(&s.to_le_bytes());
        }
        p
    };
    let chunkings: [&[u16]; 4] = [&[1], &[7, 3], &[4096], &[35, 1, 100]];
    let mut out = Vec::new();
    for mode in 0..8u8 {
        for sizes in chunkings {
            for body in [&stream, &big] {
                out.push([prefix(mode, sizes), body.clone()].concat());
            }
        }
    }
    for f in &frames {
        for sizes in [&[1u16][..], &[35, 1, 100]] {
            out.push([prefix(3, sizes), f.clone()].concat());
        }
    }
    out
}
