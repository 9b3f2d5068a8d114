//! Bytes on a socket: reading frames (payloads straight into segments) and vectored writes.
//! Everything about what the bytes mean is in [`crate::protocol::wire`]; the handshake is
//! [`super::handshake`]'s.

use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

use crate::base::error::{Error, Result};
use crate::protocol::wire::{self, BufferResponseHeader, Decoder, Frame, Message, MAX_CONTROL_FRAME_LEN};

/// Bytes read from the socket into the decoder at a time. Small, so that most of a data
/// payload is read by the kernel straight into its segment rather than through this buffer.
const READ_CHUNK: usize = 4096;

/// A byte stream frames are read from. Besides plain reads it can fill two buffers with one
/// system call: the rest of a data payload and, behind it, the start of what follows (the
/// next frame's header, usually). Reading a 32 KiB payload straight into its record then
/// takes one call per buffer instead of two (one for the header, one for the payload).
pub(crate) trait FrameSource: AsyncRead + Unpin {
    /// Reads into `first` and, once `first` is full, into `second`; returns how many bytes
    /// went into each (0 and 0 at the end of the stream). The default reads into `first`
    /// only.
    fn poll_read_two(
        &mut self,
        cx: &mut Context<'_>,
        first: &mut [MaybeUninit<u8>],
        second: &mut [u8],
    ) -> Poll<std::io::Result<(usize, usize)>> {
        let _ = second;
        let mut rb = ReadBuf::uninit(first);
        ready!(Pin::new(self).poll_read(cx, &mut rb))?;
        Poll::Ready(Ok((rb.filled().len(), 0)))
    }
}

/// One `recvmsg` with two buffers.
impl FrameSource for tokio::net::tcp::OwnedReadHalf {
    fn poll_read_two(
        &mut self,
        cx: &mut Context<'_>,
        first: &mut [MaybeUninit<u8>],
        second: &mut [u8],
    ) -> Poll<std::io::Result<(usize, usize)>> {
        let stream: &tokio::net::TcpStream = self.as_ref();
        let first_len = first.len();
        loop {
            ready!(stream.poll_read_ready(cx))?;
            let mut bufs = [
                socket2::MaybeUninitSlice::new(&mut *first),
                // SAFETY: the socket only writes initialized bytes into it.
                socket2::MaybeUninitSlice::new(unsafe {
                    &mut *(&mut *second as *mut [u8] as *mut [MaybeUninit<u8>])
                }),
            ];
            let read = stream.try_io(tokio::io::Interest::READABLE, || {
                socket2::SockRef::from(stream).recv_vectored(&mut bufs)
            });
            match read {
                Ok((n, _flags)) => return Poll::Ready(Ok((n.min(first_len), n.saturating_sub(first_len)))),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> FrameSource for tokio::io::ReadHalf<S> {}

/// An owned frame: a control message or event, or the header of a data payload that
/// [`FrameReader::read_payload`] must take next.
pub(crate) enum InFrame {
    /// A whole message (never a data BufferResponse).
    Message(Message<'static>),
    /// A data BufferResponse header; its payload follows.
    Data(BufferResponseHeader),
}

/// Reads frames from a byte stream.
pub(crate) struct FrameReader<R> {
    rd: R,
    dec: Decoder,
}

fn io_lost(e: std::io::Error) -> Error {
    Error::ConnectionLost(e.to_string())
}

impl<R: FrameSource> FrameReader<R> {
    pub(crate) fn new(rd: R) -> Self {
        FrameReader {
            rd,
            dec: Decoder::new(MAX_CONTROL_FRAME_LEN),
        }
    }

    /// Raises the frame limit after the handshake.
    pub(crate) fn set_max_frame_size(&mut self, n: usize) {
        self.dec.set_max_frame_size(n);
    }

    async fn fill(&mut self) -> Result<()> {
        let buf = self.dec.read_buf(READ_CHUNK);
        let n = self.rd.read(buf).await.map_err(io_lost)?;
        if n == 0 {
            return Err(Error::ConnectionLost(if self.dec.buffered() > 0 {
                "the peer closed the connection in the middle of a frame".into()
            } else {
                "the peer closed the connection".into()
            }));
        }
        self.dec.commit(n);
        Ok(())
    }

    /// Waits until the peer has sent something (or closed), without taking a frame: bytes
    /// read stay in the decoder for [`Self::next`]. Cancel-safe.
    pub(crate) async fn wait_readable(&mut self) -> Result<()> {
        if self.dec.buffered() == 0 {
            self.fill().await?;
        }
        Ok(())
    }

    /// The next frame. A clean end of stream between frames is `ConnectionLost` too: the
    /// callers know whether they expected it.
    pub(crate) async fn next(&mut self) -> Result<InFrame> {
        loop {
            match self.dec.next_frame()? {
                Some(Frame::DataHeader(h)) => return Ok(InFrame::Data(h)),
                Some(Frame::Message(m)) => return Ok(InFrame::Message(m.into_owned())),
                None => self.fill().await?,
            }
        }
    }

    /// Reads the next `dst.len()` bytes of the current data payload (at most what remains of
    /// it) into `dst`: what the decoder has buffered first, the rest straight from the socket.
    pub(crate) async fn read_payload(&mut self, dst: &mut [u8]) -> Result<()> {
        // SAFETY: `read_payload_into` only writes initialized bytes, so `dst` stays
        // initialized.
        let dst = unsafe { &mut *(dst as *mut [u8] as *mut [MaybeUninit<u8>]) };
        self.read_payload_into(dst).await
    }

    /// Bytes of the current data payload the decoder already holds (readable without a
    /// system call).
    pub(crate) fn buffered_payload(&self) -> usize {
        self.dec.buffered().min(self.dec.payload_remaining())
    }

    /// Reads the next `dst.len()` bytes of the current data payload (at most what remains of
    /// it) into possibly uninitialized memory, initializing exactly those bytes: what the
    /// decoder has buffered first, the rest straight from the socket.
    pub(crate) async fn read_payload_into(&mut self, dst: &mut [MaybeUninit<u8>]) -> Result<()> {
        debug_assert!(dst.len() <= self.dec.payload_remaining());
        let mut done = self.dec.read_payload_into(dst);
        while done < dst.len() {
            // The rest straight from the socket into `dst`, and what follows the payload into
            // the decoder (which is empty now: its bytes were payload and went first).
            let rest = &mut dst[done..];
            let (rd, dec) = (&mut self.rd, &mut self.dec);
            let (n, more) = {
                let behind = dec.read_buf(READ_CHUNK);
                let behind = &mut behind[..READ_CHUNK];
                std::future::poll_fn(|cx| rd.poll_read_two(cx, rest, behind))
                    .await
                    .map_err(io_lost)?
            };
            if n == 0 {
                return Err(Error::ConnectionLost(
                    "the peer closed the connection in the middle of a buffer".into(),
                ));
            }
            self.dec.payload_read_elsewhere(n)?;
            self.dec.commit(more);
            done += n;
        }
        Ok(())
    }

    /// Skips the current data payload.
    pub(crate) async fn skip_payload(&mut self) -> Result<()> {
        let mut scratch = [0u8; READ_CHUNK];
        loop {
            let left = self.dec.discard_payload();
            if left == 0 {
                return Ok(());
            }
            let want = left.min(scratch.len());
            let n = self.rd.read(&mut scratch[..want]).await.map_err(io_lost)?;
            if n == 0 {
                return Err(Error::ConnectionLost(
                    "the peer closed the connection in the middle of a buffer".into(),
                ));
            }
            self.dec.payload_read_elsewhere(n)?;
        }
    }
}

/// Writes all of `slices` with as few vectored writes as the socket allows.
pub(crate) async fn write_all_vectored<W: AsyncWrite + Unpin>(
    w: &mut W,
    slices: &mut [IoSlice<'_>],
) -> Result<()> {
    let mut slices = slices;
    // Skip leading empty slices so that a 0-byte write means the peer is gone.
    IoSlice::advance_slices(&mut slices, 0);
    while !slices.is_empty() {
        let n = w.write_vectored(slices).await.map_err(io_lost)?;
        if n == 0 {
            return Err(Error::ConnectionLost("the socket accepted no bytes".into()));
        }
        IoSlice::advance_slices(&mut slices, n);
    }
    // A TLS writer may hold sealed records until flushed (a no-op on plain TCP).
    w.flush().await.map_err(io_lost)
}

/// Encodes and writes one message.
pub(crate) async fn write_message<W: AsyncWrite + Unpin>(w: &mut W, msg: &Message<'_>) -> Result<()> {
    let mut out = Vec::with_capacity(64);
    wire::encode(msg, &mut out)?;
    w.write_all(&out).await.map_err(io_lost)?;
    w.flush().await.map_err(io_lost)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::credit::{BufferHeader, Credit, DataType};
    use crate::protocol::wire::ReceiverId;

    /// Data frames of random sizes between control messages, written in random pieces over a
    /// real socket and read back in random pieces: every payload byte and message arrives in
    /// order, whether it came through the decoder or the two-buffer read.
    #[tokio::test]
    async fn payloads_read_two_buffers_at_a_time_keep_the_stream_in_order() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        const SEGMENT: usize = 32 * 1024;
        let mut stream = Vec::new();
        let mut expected = Vec::new();
        for i in 0..300u64 {
            let len = 1 + next(SEGMENT);
            let payload: Vec<u8> = (0..len).map(|j| (j as u64 * 31 + i) as u8).collect();
            let header = BufferHeader {
                sequence_number: i,
                backlog: 0,
                data_type: DataType::Data,
            };
            stream.extend(wire::encode_buffer_response_header(ReceiverId(7), header, len).unwrap());
            stream.extend(&payload);
            expected.push(payload);
            if next(3) == 0 {
                let msg = Message::AddCredit {
                    receiver: ReceiverId(i),
                    credit: Credit::new(1),
                };
                wire::encode(&msg, &mut stream).unwrap();
            }
        }
        let pieces: Vec<usize> = (0..stream.len()).map(|_| 1 + next(70_000)).collect();
        let writer = tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            let mut at = 0;
            for piece in pieces {
                if at == stream.len() {
                    break;
                }
                let end = (at + piece).min(stream.len());
                sock.write_all(&stream[at..end]).await.unwrap();
                at = end;
                if piece % 4 == 0 {
                    tokio::task::yield_now().await;
                }
            }
        });
        let (rd, _wr) = tokio::net::TcpStream::connect(addr).await.unwrap().into_split();
        let mut reader = FrameReader::new(rd);
        reader.set_max_frame_size(wire::max_frame_size(SEGMENT));
        let mut credits = 0;
        for (i, payload) in expected.iter().enumerate() {
            let header = loop {
                match reader.next().await.unwrap() {
                    InFrame::Data(h) => break h,
                    InFrame::Message(Message::AddCredit { receiver, .. }) => {
                        assert_eq!(receiver.0 + 1, i as u64, "message out of place");
                        credits += 1;
                    }
                    InFrame::Message(m) => panic!("unexpected {m:?}"),
                }
            };
            assert_eq!(
                (header.sequence_number, header.payload_len),
                (i as u64, payload.len())
            );
            let mut got = vec![0u8; payload.len()];
            let mut at = 0;
            while at < got.len() {
                let n = (1 + next(12_000)).min(got.len() - at);
                if i % 2 == 0 {
                    reader.read_payload(&mut got[at..at + n]).await.unwrap();
                } else {
                    let mut uninit = vec![MaybeUninit::<u8>::uninit(); n];
                    reader.read_payload_into(&mut uninit).await.unwrap();
                    for (d, s) in got[at..at + n].iter_mut().zip(&uninit) {
                        // SAFETY: read_payload_into initialized all of it.
                        *d = unsafe { s.assume_init() };
                    }
                }
                at += n;
            }
            assert!(&got == payload, "payload {i} differs");
        }
        writer.await.unwrap();
        assert!(
            credits > 50,
            "only {credits} control messages: the test lost its mix"
        );
        assert!(matches!(reader.next().await, Err(Error::ConnectionLost(_))));
    }
}
