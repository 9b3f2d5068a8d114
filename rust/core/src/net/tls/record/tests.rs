//! The record layer against itself: round trips, record layout, tampering, KeyUpdate.

use super::*;
use aws_lc_rs::aead::NONCE_LEN;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::rustls::crypto::cipher::{AeadKey, Iv};
use tokio_rustls::rustls::ConnectionTrafficSecrets;

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
    opened_counting(wire, read_size).await.map(|(out, _)| out)
}

/// The plaintext of `wire` read `read_size` bytes at a time, and how much of it was opened
/// straight into the read buffer.
async fn opened_counting(wire: Vec<u8>, read_size: usize) -> io::Result<(Vec<u8>, usize)> {
    let mut r = RecordReader::new(&wire[..], direction(7), Arc::default());
    let mut out = Vec::new();
    let mut buf = vec![0u8; read_size];
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            return Ok((out, r.direct_bytes));
        }
        out.extend_from_slice(&buf[..n]);
    }
}

/// The inner plaintext length (content and type byte) of each record of `wire`, read from
/// the headers.
fn record_lengths(wire: &[u8]) -> Vec<usize> {
    let mut at = 0;
    let mut lengths = Vec::new();
    while at < wire.len() {
        let len = usize::from(u16::from_be_bytes([wire[at + 3], wire[at + 4]]));
        lengths.push(len - TAG_LEN);
        at += HEADER_LEN + len;
    }
    assert_eq!(at, wire.len(), "whole records");
    lengths
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
}

#[tokio::test]
async fn records_round_trip_across_key_updates_and_read_sizes() {
    let data = pattern(300_000);
    for (per_key, piece, read) in [
        (3, 1000, 777),
        (1 << 24, 70_000, 65_536),
        (1, 16_384, 1),
        // KeyUpdates opened straight into a large read buffer, then followed.
        (3, 70_000, 65_536),
        (1, 40_000, 16_385),
    ] {
        let wire = sealed(&data, per_key, piece).await;
        let (out, direct) = opened_counting(wire, read).await.unwrap();
        assert_eq!(out, data, "per_key {per_key}, piece {piece}, read {read}");
        if read > MAX_PLAINTEXT && piece >= SEAL_DIRECT_MIN {
            assert!(
                direct > data.len() / 2,
                "only {direct} bytes opened in the caller's buffer"
            );
        } else if read <= MAX_PLAINTEXT / 2 {
            assert_eq!(direct, 0, "records larger than the reads are opened in place");
        }
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
    // Opened in place (4 KiB reads) and straight into the reader's buffer (64 KiB reads).
    for read in [4096, 65_536] {
        for at in [0, 3, 4, 100, 20_000, wire.len() - 30] {
            let mut bad = wire.clone();
            bad[at] ^= 0x40;
            let e = opened(bad, read).await.unwrap_err();
            assert_eq!(
                e.kind(),
                io::ErrorKind::InvalidData,
                "byte {at}, reads of {read}: {e}"
            );
        }
    }
    // The first record is sound, the second not: its plaintext is never handed out.
    let mut bad = wire.clone();
    bad[HEADER_LEN + 16_384 + 1 + TAG_LEN + HEADER_LEN + 10] ^= 1;
    let mut r = RecordReader::new(&bad[..], direction(7), Arc::default());
    let mut buf = vec![0u8; 65_536];
    assert_eq!(r.read(&mut buf).await.unwrap(), 16_384);
    assert_eq!(buf[..16_384], data[..16_384]);
    let e = r.read(&mut buf).await.unwrap_err();
    assert!(e.to_string().contains("authentication"), "{e}");
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

#[tokio::test]
async fn large_slices_get_records_of_their_own_that_fit_a_payload_sized_read() {
    // Two frames as the connection writes them: a small header, then a 32 KiB payload.
    let (h1, h2) = (pattern(13), pattern(17));
    let (p1, p2) = (pattern(32_768), pattern(40_000));
    let (a, mut b) = tokio::io::duplex(1 << 20);
    let mut w = RecordWriter::new(a, direction(7), Arc::default());
    let mut slices = [&h1, &p1, &h2, &p2].map(|s| IoSlice::new(s));
    crate::net::io::write_all_vectored(&mut w, &mut slices)
        .await
        .unwrap();
    w.shutdown().await.unwrap();
    drop(w);
    let mut wire = Vec::new();
    b.read_to_end(&mut wire).await.unwrap();
    // A payload's records stop one byte short of its end; that byte shares a record with
    // the next header. (Inner lengths: content + 1.)
    assert_eq!(
        record_lengths(&wire),
        [14, 16_385, 16_384, 1 + 17 + 1, 16_385, 16_385, 7_232, 2, 3]
    );
    // A reader reading each payload into a buffer of its size (and what follows it into a
    // second buffer, as the frame reader does): every payload record lands there straight,
    // all but the byte each payload's records leave out.
    let mut r = RecordReader::new(&wire[..], direction(7), Arc::default());
    let mut carried = Vec::new();
    let mut headers_carried = Vec::new();
    for (header, payload) in [(&h1, &p1), (&h2, &p2)] {
        let mut head = std::mem::take(&mut carried);
        headers_carried.push(head.len());
        let mut rest = vec![0u8; header.len() - head.len()];
        r.read_exact(&mut rest).await.unwrap();
        head.extend(rest);
        assert_eq!(&head, header);
        let mut dst = vec![MaybeUninit::<u8>::uninit(); payload.len()];
        let mut behind = [0u8; 64];
        let mut at = 0;
        while at < dst.len() {
            let (n, m) = std::future::poll_fn(|cx| {
                crate::net::io::FrameSource::poll_read_two(&mut r, cx, &mut dst[at..], &mut behind)
            })
            .await
            .unwrap();
            assert!(n > 0, "no end of stream inside a payload");
            at += n;
            assert!(
                m == 0 || at == dst.len(),
                "bytes behind a payload that is not full"
            );
            carried.extend_from_slice(&behind[..m]);
        }
        // SAFETY: poll_read_two initialized all of it.
        let got: Vec<u8> = dst.iter().map(|b| unsafe { b.assume_init() }).collect();
        assert!(&got == payload);
    }
    assert_eq!(
        headers_carried,
        [0, h2.len()],
        "the second header came behind the end of the first payload, in one read"
    );
    assert_eq!(r.direct_bytes, p1.len() - 1 + p2.len() - 1);
    assert_eq!(
        r.read(&mut [0u8; 8]).await.unwrap(),
        0,
        "close_notify ends the stream"
    );
}

/// Writes `slices` (grouped into vectored writes of `group` slices) through a writer into a
/// small pipe, so writes are partial and records cross batch boundaries, while a reader takes
/// the plaintext back with two-buffer reads of the given sizes (cycled). Returns what it read.
async fn through_pipe(
    slices: Vec<Vec<u8>>,
    group: usize,
    reads: Vec<(usize, usize)>,
    per_key: u64,
) -> Vec<u8> {
    let (a, b) = tokio::io::duplex(48 * 1024);
    let writer = tokio::spawn(async move {
        let mut w = RecordWriter::new(a, direction(7), Arc::default());
        w.set_records_per_key(per_key);
        for chunk in slices.chunks(group) {
            let mut io: Vec<IoSlice<'_>> = chunk.iter().map(|s| IoSlice::new(s)).collect();
            crate::net::io::write_all_vectored(&mut w, &mut io).await.unwrap();
        }
        w.shutdown().await.unwrap();
    });
    let mut r = RecordReader::new(b, direction(7), Arc::default());
    let mut out = Vec::new();
    for (first_len, second_len) in reads.iter().cycle() {
        let mut first = vec![MaybeUninit::<u8>::uninit(); *first_len];
        let mut second = vec![0u8; *second_len];
        let (n, m) = std::future::poll_fn(|cx| {
            crate::net::io::FrameSource::poll_read_two(&mut r, cx, &mut first, &mut second)
        })
        .await
        .unwrap();
        if n == 0 {
            assert_eq!(m, 0);
            break;
        }
        assert!(
            m == 0 || n == first.len(),
            "the second buffer before the first was full"
        );
        // SAFETY: poll_read_two initialized the first `n` bytes.
        out.extend(first[..n].iter().map(|b| unsafe { b.assume_init() }));
        out.extend_from_slice(&second[..m]);
    }
    writer.await.unwrap();
    out
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 32, ..Default::default() })]

    /// Any mix of slice sizes (small ones gathered, large ones sealed straight), write
    /// groupings, read sizes and rekeying comes out as it went in.
    #[test]
    fn any_slices_and_reads_round_trip(
        sizes in proptest::collection::vec(1usize..70_000, 1..24),
        group in 1usize..6,
        reads in proptest::collection::vec((1usize..70_000, 0usize..5_000), 1..6),
        per_key in proptest::prop_oneof![proptest::strategy::Just(1u64 << 24), 1u64..8],
    ) {
        let mut at = 0;
        let slices: Vec<Vec<u8>> = sizes
            .iter()
            .map(|&n| {
                at += n;
                pattern(at)[at - n..].to_vec()
            })
            .collect();
        let expected: Vec<u8> = slices.concat();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let got = rt.block_on(through_pipe(slices, group, reads, per_key));
        proptest::prop_assert!(got == expected, "{} bytes read, {} written", got.len(), expected.len());
    }
}
