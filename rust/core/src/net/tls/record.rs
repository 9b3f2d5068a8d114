//! The TLS 1.3 record layer (RFC 8446 §5) on the keys rustls negotiated, for the data phase
//! of a connection (see [`super::handshake`] for the handshake and the switch-over).
//!
//! Why not rustls's own: its receive path copies every byte three times in user space (the
//! socket into its deframer in 4 KiB pieces, the decrypted record into a new buffer, that
//! into ours), and both directions share one connection object behind a lock. Here each
//! direction has its own state, so the read half and the write half of a connection share
//! nothing but a flag: [`RecordReader`] reads ciphertext in large reads, opens each record in
//! place and hands out the plaintext (one copy, into the caller's buffer); [`RecordWriter`]
//! copies plaintext into records and seals them in place.
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
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use aws_lc_rs::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey, NONCE_LEN};
use aws_lc_rs::hkdf;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_rustls::rustls::ConnectionTrafficSecrets;

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
/// Plaintext a write takes at a time, at most (then written to the socket in one call).
const WRITE_BATCH: usize = 256 * 1024;

fn invalid(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

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

/// One direction's keys: the traffic secret (for KeyUpdate), the AEAD key, the IV and the
/// sequence number of the next record.
pub(crate) struct Direction {
    aead: &'static aead::Algorithm,
    hkdf: hkdf::Algorithm,
    secret: Vec<u8>,
    key: LessSafeKey,
    iv: [u8; NONCE_LEN],
    seq: u64,
}

/// An output length for HKDF-Expand.
struct Len(usize);

impl hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

/// HKDF-Expand-Label (RFC 8446 §7.1) with an empty context.
fn expand_label(alg: hkdf::Algorithm, secret: &[u8], label: &[u8], out: &mut [u8]) -> io::Result<()> {
    let prk = hkdf::Prk::new_less_safe(alg, secret);
    let len = (out.len() as u16).to_be_bytes();
    let label_len = [(6 + label.len()) as u8];
    let info: [&[u8]; 5] = [&len, &label_len, b"tls13 ", label, &[0]];
    prk.expand(&info, Len(out.len()))
        .and_then(|okm| okm.fill(out))
        .map_err(|_| invalid("HKDF-Expand-Label failed"))
}

impl Direction {
    /// Keys from a traffic secret of the suite `suite` (the variant of rustls's extracted
    /// secrets), starting at sequence number `seq`.
    pub(crate) fn new(suite: &ConnectionTrafficSecrets, secret: &[u8], seq: u64) -> io::Result<Direction> {
        let (aead, hkdf) = match suite {
            ConnectionTrafficSecrets::Aes128Gcm { .. } => (&aead::AES_128_GCM, hkdf::HKDF_SHA256),
            ConnectionTrafficSecrets::Aes256Gcm { .. } => (&aead::AES_256_GCM, hkdf::HKDF_SHA384),
            ConnectionTrafficSecrets::Chacha20Poly1305 { .. } => {
                (&aead::CHACHA20_POLY1305, hkdf::HKDF_SHA256)
            }
            _ => return Err(invalid("unsupported TLS cipher suite")),
        };
        let mut d = Direction {
            aead,
            hkdf,
            secret: secret.to_vec(),
            key: LessSafeKey::new(
                UnboundKey::new(aead, &vec![0; aead.key_len()]).map_err(|_| invalid("AEAD key"))?,
            ),
            iv: [0; NONCE_LEN],
            seq,
        };
        d.derive()?;
        Ok(d)
    }

    /// Key and IV from the current secret.
    fn derive(&mut self) -> io::Result<()> {
        let mut key = vec![0; self.aead.key_len()];
        expand_label(self.hkdf, &self.secret, b"key", &mut key)?;
        expand_label(self.hkdf, &self.secret, b"iv", &mut self.iv)?;
        self.key = LessSafeKey::new(UnboundKey::new(self.aead, &key).map_err(|_| invalid("AEAD key"))?);
        Ok(())
    }

    /// Whether the key and IV are the ones rustls derived (`suite`'s): a check that the
    /// secrets logged and extracted belong together.
    pub(crate) fn matches(&self, suite: &ConnectionTrafficSecrets) -> bool {
        let (key, iv) = match suite {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv }
            | ConnectionTrafficSecrets::Aes256Gcm { key, iv }
            | ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => (key, iv),
            _ => return false,
        };
        let mut ours = vec![0; self.aead.key_len()];
        expand_label(self.hkdf, &self.secret, b"key", &mut ours).is_ok()
            && ours == key.as_ref()
            && self.iv[..] == *iv.as_ref()
    }

    /// KeyUpdate: the next generation of secret, key and IV; the sequence restarts at 0.
    fn update(&mut self) -> io::Result<()> {
        let mut next = vec![0; self.secret.len()];
        expand_label(self.hkdf, &self.secret, b"traffic upd", &mut next)?;
        self.secret = next;
        self.seq = 0;
        self.derive()
    }

    /// The nonce of the next record; counts it.
    fn next_nonce(&mut self) -> io::Result<Nonce> {
        let mut nonce = self.iv;
        for (n, s) in nonce[NONCE_LEN - 8..].iter_mut().zip(self.seq.to_be_bytes()) {
            *n ^= s;
        }
        self.seq = self
            .seq
            .checked_add(1)
            .ok_or_else(|| invalid("TLS sequence number exhausted"))?;
        Ok(Nonce::assume_unique_for_key(nonce))
    }
}

/// What the two halves of one connection share: the peer asked for a KeyUpdate, which the
/// writer must answer with its own.
#[derive(Default)]
pub(crate) struct Shared {
    update_requested: AtomicBool,
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
        }
    }

    /// Opens the record at `start` if it is all there; `Ok(false)` if more bytes are needed.
    fn open_next(&mut self) -> io::Result<bool> {
        let have = &self.buf[self.start..self.end];
        if have.len() < HEADER_LEN {
            return Ok(false);
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
            return Ok(false);
        }
        let body = self.start + HEADER_LEN;
        self.start = body + len;
        let nonce = self.rx.next_nonce()?;
        let plain = self
            .rx
            .key
            .open_in_place(nonce, Aad::from(header), &mut self.buf[body..body + len])
            .map_err(|_| invalid("TLS record failed authentication"))?;
        // The content type is the last nonzero byte; zeros after it are padding.
        let Some(type_at) = plain.iter().rposition(|&b| b != 0) else {
            return Err(invalid("TLS record without a content type"));
        };
        if type_at > MAX_PLAINTEXT {
            return Err(invalid(format!("TLS record with {type_at} bytes of plaintext")));
        }
        let content_type = plain[type_at];
        let content = body..body + type_at;
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
        Ok(true)
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

impl<R: AsyncRead + Unpin> AsyncRead for RecordReader<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            let (a, b) = this.plain;
            if a < b {
                let n = (b - a).min(out.remaining());
                out.put_slice(&this.buf[a..a + n]);
                this.plain.0 += n;
                return Poll::Ready(Ok(()));
            }
            if this.closed {
                return Poll::Ready(Ok(()));
            }
            if this.open_next()? {
                continue;
            }
            // Room for a whole record after what is buffered: move the partial one to the front.
            if this.buf.len() - this.start < HEADER_LEN + MAX_CIPHERTEXT || this.start == this.end {
                this.buf.copy_within(this.start..this.end, 0);
                this.end -= this.start;
                this.start = 0;
                this.plain = (0, 0);
            }
            let mut rb = ReadBuf::new(&mut this.buf[this.end..]);
            ready!(Pin::new(&mut this.io).poll_read(cx, &mut rb))?;
            let n = rb.filled().len();
            if n == 0 {
                if this.start == this.end {
                    // The peer closed without close_notify: the end of the stream, as for TCP.
                    return Poll::Ready(Ok(()));
                }
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the peer closed the connection in the middle of a TLS record",
                )));
            }
            this.end += n;
        }
    }
}

impl<R: AsyncRead + Unpin> crate::net::io::FrameSource for RecordReader<R> {}

/// The write half: plaintext in, records out.
pub(crate) struct RecordWriter<W> {
    io: W,
    tx: Direction,
    shared: Arc<Shared>,
    /// Sealed records not yet written: `out[pos..]`.
    out: Vec<u8>,
    pos: usize,
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
            out: Vec::with_capacity(
                WRITE_BATCH + WRITE_BATCH / MAX_PLAINTEXT * (HEADER_LEN + 1 + TAG_LEN) + 64,
            ),
            pos: 0,
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

    fn seal_one(&mut self, content_type: u8, parts: &[&[u8]]) -> io::Result<()> {
        let len: usize = parts.iter().map(|p| p.len()).sum::<usize>() + 1;
        let header_at = self.out.len();
        let wire_len = (len + TAG_LEN) as u16;
        self.out.extend_from_slice(&[APPLICATION_DATA, 3, 3]);
        self.out.extend_from_slice(&wire_len.to_be_bytes());
        for p in parts {
            self.out.extend_from_slice(p);
        }
        self.out.push(content_type);
        let header: [u8; HEADER_LEN] = self.out[header_at..header_at + HEADER_LEN]
            .try_into()
            .expect("5 bytes");
        let nonce = self.tx.next_nonce()?;
        let tag = self
            .tx
            .key
            .seal_in_place_separate_tag(nonce, Aad::from(header), &mut self.out[header_at + HEADER_LEN..])
            .map_err(|_| invalid("TLS record sealing failed"))?;
        self.out.extend_from_slice(tag.as_ref());
        Ok(())
    }

    /// Writes pending records until done (`Ready(Ok)`) or the socket is full (`Pending`).
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.pos < self.out.len() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.out[self.pos..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.pos += n;
        }
        self.out.clear();
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
        // Gather up to WRITE_BATCH bytes into records of at most MAX_PLAINTEXT.
        let mut taken = 0;
        let mut parts: Vec<&[u8]> = Vec::new();
        let mut in_record = 0;
        let mut slices = bufs.iter().map(|b| &b[..]).filter(|b| !b.is_empty());
        let mut current: Option<&[u8]> = slices.next();
        while let Some(mut piece) = current {
            if taken == WRITE_BATCH {
                break;
            }
            let room = (MAX_PLAINTEXT - in_record).min(WRITE_BATCH - taken);
            if piece.len() > room {
                let (head, tail) = piece.split_at(room);
                parts.push(head);
                piece = tail;
                current = Some(piece);
            } else {
                parts.push(piece);
                current = slices.next();
            }
            let n = parts.last().map_or(0, |p| p.len());
            in_record += n;
            taken += n;
            if in_record == MAX_PLAINTEXT {
                this.seal(APPLICATION_DATA, &parts)?;
                parts.clear();
                in_record = 0;
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
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_rustls::rustls::crypto::cipher::{AeadKey, Iv};

    fn suite() -> ConnectionTrafficSecrets {
        ConnectionTrafficSecrets::Aes128Gcm {
            key: AeadKey::from([0u8; 32]),
            iv: Iv::from([0u8; NONCE_LEN]),
        }
    }

    fn direction(secret: u8) -> Direction {
        Direction::new(&suite(), &[secret; 32], 0).unwrap()
    }

    /// Records `data` as one writer seals them (rekeying every `per_key` records), written in
    /// pieces of `piece` bytes.
    async fn sealed(data: &[u8], per_key: u64, piece: usize) -> Vec<u8> {
        let (a, mut b) = tokio::io::duplex(1 << 24);
        let mut w = RecordWriter::new(a, direction(7), Arc::default());
        w.set_records_per_key(per_key);
        for chunk in data.chunks(piece) {
            w.write_all(chunk).await.unwrap();
        }
        w.shutdown().await.unwrap();
        drop(w);
        let mut out = Vec::new();
        b.read_to_end(&mut out).await.unwrap();
        out
    }

    async fn opened(wire: Vec<u8>, read_size: usize) -> io::Result<Vec<u8>> {
        let mut r = RecordReader::new(&wire[..], direction(7), Arc::default());
        let mut out = Vec::new();
        let mut buf = vec![0u8; read_size];
        loop {
            let n = r.read(&mut buf).await?;
            if n == 0 {
                return Ok(out);
            }
            out.extend_from_slice(&buf[..n]);
        }
    }

    fn pattern(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    #[tokio::test]
    async fn records_round_trip_across_key_updates_and_read_sizes() {
        let data = pattern(300_000);
        for (per_key, piece, read) in [(3, 1000, 777), (1 << 24, 70_000, 65_536), (1, 16_384, 1)] {
            let wire = sealed(&data, per_key, piece).await;
            assert_eq!(opened(wire, read).await.unwrap(), data, "per_key {per_key}");
        }
    }

    #[tokio::test]
    async fn vectored_writes_fill_records_and_keep_the_order() {
        let data = pattern(100_000);
        let (a, mut b) = tokio::io::duplex(1 << 20);
        let mut w = RecordWriter::new(a, direction(7), Arc::default());
        let mut slices: Vec<IoSlice<'_>> = data.chunks(3_000).map(IoSlice::new).collect();
        let mut slices = &mut slices[..];
        while !slices.is_empty() {
            let n = w.write_vectored(slices).await.unwrap();
            IoSlice::advance_slices(&mut slices, n);
        }
        w.shutdown().await.unwrap();
        drop(w);
        let mut wire = Vec::new();
        b.read_to_end(&mut wire).await.unwrap();
        // Full records: ceil(100,000 / 16 KiB) data records plus close_notify.
        let records = wire.len() - data.len() - 2 - 7 * (HEADER_LEN + 1 + TAG_LEN);
        assert_eq!(
            records,
            HEADER_LEN + 1 + TAG_LEN,
            "one record per 16 KiB, then the alert"
        );
        assert_eq!(opened(wire, 4096).await.unwrap(), data);
    }

    #[tokio::test]
    async fn tampered_truncated_or_foreign_records_are_errors() {
        let data = pattern(40_000);
        let wire = sealed(&data, 1 << 24, 40_000).await;
        for at in [0, 3, 4, 100, 20_000, wire.len() - 30] {
            let mut bad = wire.clone();
            bad[at] ^= 0x40;
            let e = opened(bad, 4096).await.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "byte {at}: {e}");
        }
        let e = opened(wire[..wire.len() / 2].to_vec(), 4096).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        // Another key: authentication fails.
        let mut r = RecordReader::new(&wire[..], direction(8), Arc::default());
        let e = r.read(&mut [0u8; 10]).await.unwrap_err();
        assert!(e.to_string().contains("authentication"), "{e}");
    }

    #[tokio::test]
    async fn a_key_update_request_is_answered_by_the_writer() {
        // A reader that saw update_requested makes its connection's writer rekey.
        let shared = Arc::new(Shared::default());
        shared.update_requested.store(true, Ordering::Release);
        let (a, mut b) = tokio::io::duplex(1 << 20);
        let mut w = RecordWriter::new(a, direction(7), shared.clone());
        w.write_all(b"after").await.unwrap();
        w.flush().await.unwrap();
        assert!(!shared.update_requested.load(Ordering::Acquire));
        assert_eq!(
            w.tx.seq, 1,
            "the KeyUpdate went out under the old key, the data under the new"
        );
        drop(w);
        let mut wire = Vec::new();
        b.read_to_end(&mut wire).await.unwrap();
        assert_eq!(opened(wire, 100).await.unwrap(), b"after");
    }
}
