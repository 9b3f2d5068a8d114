//! The TLS 1.3 record layer (RFC 8446 §5) on the keys rustls negotiated, for the data phase
//! of a connection (see [`super::handshake`] for the handshake and the switch-over).
//!
//! Why not rustls's own: its receive path copies every byte three times in user space (the
//! socket into its deframer in 4 KiB pieces, the decrypted record into a new buffer, that
//! into ours), and both directions share one connection object behind a lock. Here each
//! direction has its own state, so the read half and the write half of a connection share
//! nothing but a flag, and no plaintext is copied on the data path: [`RecordReader`] reads
//! ciphertext in large reads and opens a record whose plaintext fits in the caller's buffer
//! straight into it (others in place, then copied out); [`RecordWriter`] seals a large slice
//! from the caller's memory into its output, and copies only small slices (frame headers,
//! control messages) together into shared records.
//!
//! The records are standard TLS 1.3 application-data records (opaque type 23, legacy version
//! 0x0303, at most 2^14 bytes of plaintext; the real content type and no padding inside; nonce =
//! IV XOR the 64-bit sequence number; the 5-byte header as additional data), so the peer
//! could be any TLS 1.3 implementation; a test checks that against rustls both ways.
//! KeyUpdate is supported both ways: the writer rekeys before [`RECORDS_PER_KEY`] records
//! (RFC 8446 §5.5 gives 2^24.5 for AES-GCM) and answers a peer's request; the reader follows
//! the peer's. NewSessionTickets are ignored; a close_notify alert is the end of the stream,
//! any other alert an error. Suites: the three TLS 1.3 ones.

use std::io::{self, IoSlice};
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use aws_lc_rs::aead::Aad;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::keys::{invalid, Direction};

/// Bytes of a record header.
const HEADER_LEN: usize = 5;
/// Most plaintext a record carries.
const MAX_PLAINTEXT: usize = 1 << 14;
/// Most ciphertext a record may carry (RFC 8446 §5.2).
const MAX_CIPHERTEXT: usize = MAX_PLAINTEXT + 256;
const TAG_LEN: usize = 16;
/// The outer type of every protected record.
const APPLICATION_DATA: u8 = 23;
const HANDSHAKE: u8 = 22;
const ALERT: u8 = 21;
const KEY_UPDATE: u8 = 24;
const CLOSE_NOTIFY: u8 = 0;
/// Records sealed under one key before the writer rekeys (RFC 8446 §5.5: 2^24.5 for AES-GCM).
pub(crate) const RECORDS_PER_KEY: u64 = 1 << 24;
/// Ciphertext read from the socket at a time, at most.
const READ_BUFFER: usize = 256 * 1024;
/// Plaintext a write takes at a time, at most (then written to the socket in one call): as
/// much as the sender loop gathers into one vectored write, so that a TLS connection makes no
/// more socket writes, and wakes its reader no more often, than a plaintext one (a quarter of
/// this made TLS markedly slower: see docs/benchmarks.md).
const WRITE_BATCH: usize = 1024 * 1024;
/// Slices of at least this many bytes are sealed in records of their own, straight from the
/// caller's memory; shorter ones are copied together into shared records.
const SEAL_DIRECT_MIN: usize = 4096;

/// A fatal TLS alert from the peer (its description byte), as the inner error of the
/// `io::Error` a reader returns: the handshake turns it into a message (`verify::explain`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PeerAlert(pub(crate) u8);

impl std::fmt::Display for PeerAlert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the peer sent TLS alert {}", self.0)
    }
}

impl std::error::Error for PeerAlert {}

/// What the two halves of one connection share: the peer asked for a KeyUpdate, which the
/// writer must answer with its own.
#[derive(Default)]
pub(crate) struct Shared {
    update_requested: AtomicBool,
}

/// What [`RecordReader::open_next`] did.
enum Opened {
    /// A whole record is not buffered yet.
    NeedMore,
    /// Application data of this many bytes went straight into the caller's buffer.
    Direct(usize),
    /// The record was opened in the read buffer: its data, if any, is in `plain`.
    InPlace,
}

/// The inner content type of an opened record (its last nonzero byte; zeros after it are
/// padding) and the length of the content before it.
fn inner_type(plain: &[u8]) -> io::Result<(u8, usize)> {
    let Some(type_at) = plain.iter().rposition(|&b| b != 0) else {
        return Err(invalid("TLS record without a content type"));
    };
    if type_at > MAX_PLAINTEXT {
        return Err(invalid(format!("TLS record with {type_at} bytes of plaintext")));
    }
    Ok((plain[type_at], type_at))
}

/// The read half: ciphertext in, plaintext out.
pub(crate) struct RecordReader<R> {
    io: R,
    rx: Direction,
    shared: Arc<Shared>,
    /// Ciphertext read but not yet opened: `buf[start..end]`.
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// Opened plaintext not yet handed out: `buf[plain.0..plain.1]` (before `start`).
    plain: (usize, usize),
    /// close_notify arrived.
    closed: bool,
    /// Plaintext bytes opened straight into callers' buffers (tests check the fast path runs).
    #[cfg(test)]
    direct_bytes: usize,
}

impl<R: AsyncRead + Unpin> RecordReader<R> {
    pub(crate) fn new(io: R, rx: Direction, shared: Arc<Shared>) -> Self {
        RecordReader {
            io,
            rx,
            shared,
            buf: vec![0; READ_BUFFER],
            start: 0,
            end: 0,
            plain: (0, 0),
            closed: false,
            #[cfg(test)]
            direct_bytes: 0,
        }
    }

    /// Opens the record at `start` if it is all there. An application-data record whose
    /// plaintext (with its content-type byte) fits in `dst` is decrypted straight into it
    /// (`Opened::Direct`, no copy after the AEAD); any other is opened in place and its
    /// content left in `plain` (`Opened::InPlace`).
    fn open_next(&mut self, dst: &mut [MaybeUninit<u8>]) -> io::Result<Opened> {
        let have = &self.buf[self.start..self.end];
        if have.len() < HEADER_LEN {
            return Ok(Opened::NeedMore);
        }
        let header: [u8; HEADER_LEN] = have[..HEADER_LEN].try_into().expect("5 bytes");
        let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
        if header[0] != APPLICATION_DATA || header[1] != 3 || header[2] != 3 {
            return Err(invalid(format!(
                "not a TLS 1.3 protected record (type {}, version {}.{})",
                header[0], header[1], header[2]
            )));
        }
        if !(TAG_LEN + 1..=MAX_CIPHERTEXT).contains(&len) {
            return Err(invalid(format!("TLS record of {len} bytes")));
        }
        if have.len() < HEADER_LEN + len {
            return Ok(Opened::NeedMore);
        }
        let body = self.start + HEADER_LEN;
        self.start = body + len;
        let nonce = self.rx.next_nonce()?;
        let inner_len = len - TAG_LEN;
        let (content_type, content_len) = if inner_len <= dst.len() {
            // SAFETY: the AEAD only writes `out` (every byte of it, before anything reads it),
            // so no uninitialized byte is read; `dst` is not used as uninitialized afterwards
            // where it was written.
            let out = unsafe { &mut *(&mut dst[..inner_len] as *mut [MaybeUninit<u8>] as *mut [u8]) };
            let (ciphertext, tag) = self.buf[body..body + len].split_at(inner_len);
            self.rx
                .key
                .open_separate_gather(nonce, Aad::from(header), ciphertext, tag, out)
                .map_err(|_| invalid("TLS record failed authentication"))?;
            let (content_type, content_len) = inner_type(out)?;
            if content_type == APPLICATION_DATA {
                #[cfg(test)]
                {
                    self.direct_bytes += content_len;
                }
                return Ok(Opened::Direct(content_len));
            }
            // A control record (rare): its content back into the buffer, handled below.
            self.buf[body..body + content_len].copy_from_slice(&out[..content_len]);
            (content_type, content_len)
        } else {
            let plain = self
                .rx
                .key
                .open_in_place(nonce, Aad::from(header), &mut self.buf[body..body + len])
                .map_err(|_| invalid("TLS record failed authentication"))?;
            inner_type(plain)?
        };
        let content = body..body + content_len;
        match content_type {
            APPLICATION_DATA => self.plain = (content.start, content.end),
            HANDSHAKE => self.on_handshake(content.start, content.end)?,
            ALERT => {
                let alert = &self.buf[content];
                if alert.len() == 2 && alert[1] == CLOSE_NOTIFY {
                    self.closed = true;
                } else {
                    let description = alert.get(1).copied().unwrap_or(0);
                    return Err(io::Error::new(io::ErrorKind::InvalidData, PeerAlert(description)));
                }
            }
            other => return Err(invalid(format!("TLS record of content type {other}"))),
        }
        Ok(Opened::InPlace)
    }

    /// Post-handshake messages: KeyUpdate is followed, anything else (tickets) ignored.
    fn on_handshake(&mut self, mut at: usize, end: usize) -> io::Result<()> {
        while at < end {
            let msg = &self.buf[at..end];
            if msg.len() < 4 {
                return Err(invalid("truncated TLS handshake message"));
            }
            let len = usize::from(msg[1]) << 16 | usize::from(msg[2]) << 8 | usize::from(msg[3]);
            if msg.len() < 4 + len {
                return Err(invalid("TLS handshake message split across records"));
            }
            if msg[0] == KEY_UPDATE {
                match (len, msg.get(4)) {
                    (1, Some(0)) => {}
                    (1, Some(1)) => self.shared.update_requested.store(true, Ordering::Release),
                    _ => return Err(invalid("malformed TLS KeyUpdate")),
                }
                if at + 4 + len != end {
                    return Err(invalid("data after a TLS KeyUpdate in its record"));
                }
                self.rx.update()?;
            }
            at += 4 + len;
        }
        Ok(())
    }
}

impl<R: AsyncRead + Unpin> RecordReader<R> {
    /// Plaintext into `first` and, once `first` is full, into `second` (the contract of
    /// `FrameSource::poll_read_two`): a record that fits in `first` is decrypted straight
    /// into it; what is left of a record opened in place is copied. Returns as soon as some
    /// plaintext was handed out; `(0, 0)` is the end of the stream.
    fn poll_plain(
        &mut self,
        cx: &mut Context<'_>,
        first: &mut [MaybeUninit<u8>],
        second: &mut [u8],
    ) -> Poll<io::Result<(usize, usize)>> {
        loop {
            let (a, b) = self.plain;
            if a < b {
                let n = (b - a).min(first.len());
                // SAFETY: `n` bytes fit in both; the read buffer and `first` do not overlap.
                unsafe {
                    std::ptr::copy_nonoverlapping(self.buf[a..].as_ptr(), first.as_mut_ptr().cast::<u8>(), n)
                };
                let m = if n == first.len() {
                    (b - a - n).min(second.len())
                } else {
                    0
                };
                second[..m].copy_from_slice(&self.buf[a + n..a + n + m]);
                self.plain.0 += n + m;
                return Poll::Ready(Ok((n, m)));
            }
            if self.closed || first.is_empty() {
                return Poll::Ready(Ok((0, 0)));
            }
            match self.open_next(first)? {
                Opened::Direct(0) | Opened::InPlace => continue,
                Opened::Direct(n) => return Poll::Ready(Ok((n, 0))),
                Opened::NeedMore => {}
            }
            // Room for a whole record after what is buffered: move the partial one to the front.
            if self.buf.len() - self.start < HEADER_LEN + MAX_CIPHERTEXT || self.start == self.end {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
                self.plain = (0, 0);
            }
            let mut rb = ReadBuf::new(&mut self.buf[self.end..]);
            ready!(Pin::new(&mut self.io).poll_read(cx, &mut rb))?;
            let n = rb.filled().len();
            if n == 0 {
                if self.start == self.end {
                    // The peer closed without close_notify: the end of the stream, as for TCP.
                    return Poll::Ready(Ok((0, 0)));
                }
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the peer closed the connection in the middle of a TLS record",
                )));
            }
            self.end += n;
        }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for RecordReader<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        // SAFETY: `poll_plain` only writes initialized bytes into it, and reports how many.
        let unfilled = unsafe { out.unfilled_mut() };
        let (n, _) = ready!(self.poll_plain(cx, unfilled, &mut []))?;
        // SAFETY: `poll_plain` initialized the first `n` bytes of the unfilled part.
        unsafe { out.assume_init(n) };
        out.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl<R: AsyncRead + Unpin> crate::net::io::FrameSource for RecordReader<R> {
    fn poll_read_two(
        &mut self,
        cx: &mut Context<'_>,
        first: &mut [MaybeUninit<u8>],
        second: &mut [u8],
    ) -> Poll<io::Result<(usize, usize)>> {
        self.poll_plain(cx, first, second)
    }
}

/// The write half: plaintext in, records out.
pub(crate) struct RecordWriter<W> {
    io: W,
    tx: Direction,
    shared: Arc<Shared>,
    /// Sealed records not yet written: `out[pos..filled]` (`out` stays initialized, so a
    /// record is sealed into it without zeroing it first).
    out: Vec<u8>,
    pos: usize,
    filled: usize,
    /// Records under one key before a KeyUpdate.
    records_per_key: u64,
    /// close_notify was sealed.
    close_sent: bool,
}

impl<W: AsyncWrite + Unpin> RecordWriter<W> {
    pub(crate) fn new(io: W, tx: Direction, shared: Arc<Shared>) -> Self {
        RecordWriter {
            io,
            tx,
            shared,
            out: vec![0; WRITE_BATCH + WRITE_BATCH / SEAL_DIRECT_MIN * (HEADER_LEN + 1 + TAG_LEN) + 64],
            pos: 0,
            filled: 0,
            records_per_key: RECORDS_PER_KEY,
            close_sent: false,
        }
    }

    /// Rekeys after `n` records instead of [`RECORDS_PER_KEY`] (tests).
    #[cfg(test)]
    pub(crate) fn set_records_per_key(&mut self, n: u64) {
        self.records_per_key = n;
    }

    /// Appends one record of `content_type` whose plaintext is gathered from `parts`.
    fn seal(&mut self, content_type: u8, parts: &[&[u8]]) -> io::Result<()> {
        if self.tx.seq >= self.records_per_key || self.shared.update_requested.swap(false, Ordering::AcqRel) {
            // KeyUpdate, update_not_requested, under the old key; then the new one.
            self.seal_one(HANDSHAKE, &[&[KEY_UPDATE, 0, 0, 1, 0]])?;
            self.tx.update()?;
        }
        self.seal_one(content_type, parts)
    }

    /// Appends one record. One part is sealed from where it is into the output (the AEAD
    /// reads it once); several are copied together and sealed in place.
    fn seal_one(&mut self, content_type: u8, parts: &[&[u8]]) -> io::Result<()> {
        let len: usize = parts.iter().map(|p| p.len()).sum::<usize>() + 1;
        let at = self.filled;
        let end = at + HEADER_LEN + len + TAG_LEN;
        if self.out.len() < end {
            self.out.resize(end, 0);
        }
        let wire_len = ((len + TAG_LEN) as u16).to_be_bytes();
        let header = [APPLICATION_DATA, 3, 3, wire_len[0], wire_len[1]];
        self.out[at..at + HEADER_LEN].copy_from_slice(&header);
        let body = &mut self.out[at + HEADER_LEN..end];
        let nonce = self.tx.next_nonce()?;
        let sealed = if let [part] = parts {
            let (ciphertext, type_and_tag) = body.split_at_mut(part.len());
            self.tx.key.seal_out_of_place_scatter(
                nonce,
                Aad::from(header),
                part,
                ciphertext,
                &[content_type],
                type_and_tag,
            )
        } else {
            let mut i = 0;
            for p in parts {
                body[i..i + p.len()].copy_from_slice(p);
                i += p.len();
            }
            body[i] = content_type;
            let (inner, tag_out) = body.split_at_mut(len);
            self.tx
                .key
                .seal_in_place_separate_tag(nonce, Aad::from(header), inner)
                .map(|tag| tag_out.copy_from_slice(tag.as_ref()))
        };
        sealed.map_err(|_| invalid("TLS record sealing failed"))?;
        self.filled = end;
        Ok(())
    }

    /// Writes pending records until done (`Ready(Ok)`) or the socket is full (`Pending`).
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.pos < self.filled {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.out[self.pos..self.filled]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.pos += n;
        }
        self.filled = 0;
        self.pos = 0;
        Poll::Ready(Ok(()))
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for RecordWriter<W> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        ready!(this.poll_drain(cx))?;
        // Up to WRITE_BATCH bytes into records of at most MAX_PLAINTEXT: a large slice (a data
        // payload) in records of its own, sealed from where it is; small ones (frame headers,
        // control messages) gathered into shared records.
        let mut taken = 0;
        let mut parts: Vec<&[u8]> = Vec::new();
        let mut in_record = 0;
        for slice in bufs.iter() {
            let mut piece = &slice[..];
            while !piece.is_empty() && taken < WRITE_BATCH {
                let budget = WRITE_BATCH - taken;
                let n = if piece.len() >= SEAL_DIRECT_MIN && budget >= SEAL_DIRECT_MIN {
                    if !parts.is_empty() {
                        this.seal(APPLICATION_DATA, &parts)?;
                        parts.clear();
                        in_record = 0;
                    }
                    // The slice's last byte is left to the next record: a reader reading the
                    // payload into a buffer of its size then has room for this record's
                    // content-type byte too, and opens it straight into that buffer.
                    let n = (piece.len() - 1).min(MAX_PLAINTEXT).min(budget);
                    this.seal(APPLICATION_DATA, &[&piece[..n]])?;
                    n
                } else {
                    let n = piece.len().min(MAX_PLAINTEXT - in_record).min(budget);
                    parts.push(&piece[..n]);
                    in_record += n;
                    if in_record == MAX_PLAINTEXT {
                        this.seal(APPLICATION_DATA, &parts)?;
                        parts.clear();
                        in_record = 0;
                    }
                    n
                };
                piece = &piece[n..];
                taken += n;
            }
            if taken == WRITE_BATCH {
                break;
            }
        }
        if !parts.is_empty() {
            this.seal(APPLICATION_DATA, &parts)?;
        }
        if taken == 0 {
            return Poll::Ready(Ok(0));
        }
        // Start writing now; what the socket does not take goes out on the next write or flush.
        match this.poll_drain(cx) {
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            _ => Poll::Ready(Ok(taken)),
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_drain(cx))?;
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_drain(cx))?;
        if !self.close_sent {
            self.seal(ALERT, &[&[1, CLOSE_NOTIFY]])?;
            self.close_sent = true;
            ready!(self.poll_drain(cx))?;
        }
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests;
