//! [`Decoder`]: the two decoding phases driven over a byte stream, whole messages or data
//! headers followed by payload bytes handed to the caller.

use super::constants::*;
use super::decode::{check, check_header, decode, decode_buffer_response_header};
use super::error::WireError;
use super::message::{BufferResponseHeader, Message, MessageType};
use crate::base::error::Result;
use crate::protocol::credit::DataType;

/// What [`Decoder::next_frame`] yields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    /// A whole message: any control message, or a BufferResponse carrying an event.
    Message(Message<'a>),
    /// The fixed fields of a data BufferResponse. Its `payload_len` bytes come next, through
    /// [`Decoder::read_payload`] / [`Decoder::payload_read_elsewhere`] or
    /// [`Decoder::discard_payload`], before the next frame.
    DataHeader(BufferResponseHeader),
}

/// Turns an incoming byte stream into messages. No I/O: the transport puts the bytes it read
/// in ([`Decoder::feed`], or [`Decoder::read_buf`] + [`Decoder::commit`] to read in place) and
/// takes messages out.
///
/// Two ways to take them out, which may be mixed between frames:
///
/// - [`Decoder::next_message`]: whole messages; a data payload is borrowed from the decoder's
///   buffer, so the whole frame is buffered first.
/// - [`Decoder::next_frame`]: a data BufferResponse is split. Its header comes out as soon as
///   its [`BUFFER_RESPONSE_HEADER_LEN`] bytes are there, then the payload goes straight to the
///   caller's segment: [`Decoder::read_payload`] hands over what is already buffered, and the
///   caller may read the rest from the socket into the segment directly and report it with
///   [`Decoder::payload_read_elsewhere`]. A full frame is then never buffered here.
///
/// The buffer grows only with the bytes put in, never by a length the peer declared: a
/// declared length over the limit is an error as soon as its 4 bytes arrive. After an error
/// the stream has lost its framing; every later call fails with the same error.
#[derive(Debug)]
pub struct Decoder {
    /// Bytes read but not decoded: `buf[start..end]`; `buf[end..]` is scratch for `read_buf`.
    pub(super) buf: Vec<u8>,
    start: usize,
    end: usize,
    max_frame_size: usize,
    /// Payload bytes of the current split data frame not yet handed over.
    payload_remaining: usize,
    /// The error that broke the stream, repeated by every later call.
    failed: Option<WireError>,
}

impl Decoder {
    /// A decoder accepting frames of at most `max_frame_size` bytes; before the handshake
    /// use [`MAX_CONTROL_FRAME_LEN`], after it [`max_frame_size`] of the negotiated segment
    /// size.
    pub fn new(max_frame_size: usize) -> Self {
        Decoder {
            buf: Vec::new(),
            start: 0,
            end: 0,
            max_frame_size,
            payload_remaining: 0,
            failed: None,
        }
    }

    /// The frame limit.
    pub fn max_frame_size(&self) -> usize {
        self.max_frame_size
    }

    /// Changes the frame limit (after the handshake); applies from the next frame.
    pub fn set_max_frame_size(&mut self, max_frame_size: usize) {
        self.max_frame_size = max_frame_size;
    }

    /// Bytes put in and not yet decoded or handed over.
    pub fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// Payload bytes of the current data frame still to be taken (0 between frames).
    pub fn payload_remaining(&self) -> usize {
        self.payload_remaining
    }

    /// Appends bytes read from the stream.
    pub fn feed(&mut self, bytes: &[u8]) {
        self.read_buf(bytes.len())[..bytes.len()].copy_from_slice(bytes);
        self.commit(bytes.len());
    }

    /// At least `min_len` writable bytes after the buffered ones, for reading in place; call
    /// [`Decoder::commit`] with the number of bytes written.
    pub fn read_buf(&mut self, min_len: usize) -> &mut [u8] {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.start > 0 && (self.buf.len() - self.end < min_len || self.start >= self.buf.len() / 2)
        {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.buf.len() - self.end < min_len {
            self.buf.resize(self.end + min_len, 0);
        }
        &mut self.buf[self.end..]
    }

    /// Marks `n` bytes of the last [`Decoder::read_buf`] as filled.
    ///
    /// # Panics
    ///
    /// If `n` is more than that slice's length.
    pub fn commit(&mut self, n: usize) {
        assert!(self.end + n <= self.buf.len(), "commit({n}) past the read buffer");
        self.end += n;
    }

    fn fail<T>(&mut self, error: WireError) -> Result<T, WireError> {
        if error.is_peer_fault() {
            self.failed = Some(error.clone());
        }
        Err(error)
    }

    fn ready(&self) -> Result<(), WireError> {
        if let Some(error) = &self.failed {
            return Err(WireError::StreamFailed(Box::new(error.clone())));
        }
        if self.payload_remaining > 0 {
            return Err(WireError::PayloadNotTaken(self.payload_remaining));
        }
        Ok(())
    }

    /// The next whole message, `Ok(None)` if more bytes are needed.
    pub fn next_message(&mut self) -> Result<Option<Message<'_>>, WireError> {
        self.ready()?;
        let info = match check(&self.buf[self.start..self.end], self.max_frame_size) {
            Ok(Some(info)) => info,
            Ok(None) => return Ok(None),
            Err(e) => return self.fail(e),
        };
        let frame_start = self.start;
        let frame_end = frame_start + info.frame_len;
        if let Err(e) = decode(&self.buf[frame_start..frame_end]) {
            return self.fail(e);
        }
        self.start = frame_end;
        // Decoded twice (once to check, once to borrow past `&mut self`): the second parse of
        // a valid frame cannot fail, and control frames are tiny.
        Ok(Some(
            decode(&self.buf[frame_start..frame_end]).expect("decoded above"),
        ))
    }

    /// The next message or data header, `Ok(None)` if more bytes are needed; see
    /// [`Frame::DataHeader`] for what to do after a data header.
    pub fn next_frame(&mut self) -> Result<Option<Frame<'_>>, WireError> {
        self.ready()?;
        let buffered = &self.buf[self.start..self.end];
        let info = match check_header(buffered, self.max_frame_size) {
            Ok(Some(info)) => info,
            Ok(None) => return Ok(None),
            Err(e) => return self.fail(e),
        };
        if info.message_type == MessageType::BufferResponse {
            match decode_buffer_response_header(buffered, self.max_frame_size) {
                Ok(Some(header)) if header.data_type == DataType::Data => {
                    self.start += BUFFER_RESPONSE_HEADER_LEN;
                    self.payload_remaining = header.payload_len;
                    return Ok(Some(Frame::DataHeader(header)));
                }
                Ok(Some(_event)) => {}
                Ok(None) => return Ok(None),
                Err(e) => return self.fail(e),
            }
        }
        Ok(self.next_message()?.map(Frame::Message))
    }

    /// Copies buffered payload bytes of the current data frame into `dst`; returns how many
    /// (at most `dst.len()` and [`Decoder::payload_remaining`]).
    pub fn read_payload(&mut self, dst: &mut [u8]) -> usize {
        let n = dst.len().min(self.payload_remaining).min(self.buffered());
        dst[..n].copy_from_slice(&self.buf[self.start..self.start + n]);
        self.start += n;
        self.payload_remaining -= n;
        n
    }

    /// [`Decoder::read_payload`] into possibly uninitialized memory: initializes the first
    /// bytes of `dst` and returns how many.
    pub fn read_payload_into(&mut self, dst: &mut [std::mem::MaybeUninit<u8>]) -> usize {
        let n = dst.len().min(self.payload_remaining).min(self.buffered());
        for (d, s) in dst[..n].iter_mut().zip(&self.buf[self.start..self.start + n]) {
            d.write(*s);
        }
        self.start += n;
        self.payload_remaining -= n;
        n
    }

    /// Drops buffered payload bytes of the current data frame (the channel was released);
    /// returns how many payload bytes are still to come.
    pub fn discard_payload(&mut self) -> usize {
        let n = self.payload_remaining.min(self.buffered());
        self.start += n;
        self.payload_remaining -= n;
        self.payload_remaining
    }

    /// The caller read `n` payload bytes of the current data frame from the stream itself,
    /// into its segment. Only allowed once nothing is buffered (so the order is kept) and for
    /// at most [`Decoder::payload_remaining`] bytes; otherwise [`WireError::BytesBuffered`] or
    /// [`WireError::PayloadOverrun`].
    pub fn payload_read_elsewhere(&mut self, n: usize) -> Result<(), WireError> {
        if self.buffered() > 0 {
            return Err(WireError::BytesBuffered(self.buffered()));
        }
        if n > self.payload_remaining {
            return Err(WireError::PayloadOverrun {
                n,
                remaining: self.payload_remaining,
            });
        }
        self.payload_remaining -= n;
        Ok(())
    }
}
