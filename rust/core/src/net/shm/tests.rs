//! The ring on its own (threads, wrap-around, a corrupted header) and links end to end in one
//! process: bytes in order, a clean end, a dead peer, the checks on the peer.

use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::sync::Arc;
use std::task::{Context, Waker};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::doorbell::{Doorbell, Waiter};
use super::link::{connect_link, serve_link, ShmListener};
use super::region::Region;
use super::ring::{Ring, RING_HEADER};
use crate::protocol::wire::ShmOffer;

fn ring_pair(cap: usize) -> (Ring, Ring) {
    let (region, _fd) = Region::create(RING_HEADER + cap).unwrap();
    let region = Arc::new(region);
    (Ring::new(region.clone(), 0, cap), Ring::new(region, 0, cap))
}

/// A pseudo-random byte stream: position `i` holds `f(i)`, so the reader checks every byte.
fn byte_at(i: u64) -> u8 {
    (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8
}

#[test]
fn the_ring_carries_a_stream_across_threads_in_order() {
    let (producer, consumer) = ring_pair(4096);
    const TOTAL: u64 = 3 << 20;
    let writer = std::thread::spawn(move || {
        let mut pos = 0u64;
        let mut chunk = 1usize;
        while pos < TOTAL {
            // Chunk sizes that do not divide the capacity, so writes straddle the wrap.
            chunk = chunk % 1500 + 7;
            let n = chunk.min((TOTAL - pos) as usize);
            let a: Vec<u8> = (pos..pos + n as u64 / 2).map(byte_at).collect();
            let b: Vec<u8> = (pos + n as u64 / 2..pos + n as u64).map(byte_at).collect();
            let wrote = producer.push(&[IoSlice::new(&a), IoSlice::new(&b)]).unwrap();
            pos += wrote as u64;
            if wrote == 0 {
                std::thread::yield_now();
            }
        }
    });
    let mut pos = 0u64;
    let mut buf = vec![MaybeUninit::<u8>::uninit(); 999];
    while pos < TOTAL {
        let n = consumer.pop(&mut buf).unwrap();
        for (k, b) in buf[..n].iter().enumerate() {
            // SAFETY: `pop` initialized the first `n` bytes.
            let b = unsafe { b.assume_init() };
            assert_eq!(b, byte_at(pos + k as u64), "byte {}", pos + k as u64);
        }
        pos += n as u64;
        if n == 0 {
            std::thread::yield_now();
        }
    }
    writer.join().unwrap();
    assert_eq!(consumer.readable().unwrap(), 0);
}

#[test]
fn a_corrupted_header_is_an_error_not_an_out_of_bounds_access() {
    let (region, _fd) = Region::create(RING_HEADER + 4096).unwrap();
    let region = Arc::new(region);
    let ring = Ring::new(region.clone(), 0, 4096);
    // The peer claims a head far beyond the capacity.
    // SAFETY: the head word at offset 0 of the header, written as the peer would.
    unsafe {
        (*(region.base() as *const std::sync::atomic::AtomicU64))
            .store(1 << 40, std::sync::atomic::Ordering::SeqCst)
    };
    let mut buf = [MaybeUninit::<u8>::uninit(); 16];
    assert!(ring.pop(&mut buf).is_err());
    assert!(ring.push(&[IoSlice::new(b"x")]).is_err());
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A listener and a linked pair (server halves, client halves) in this process.
async fn linked() -> (
    Arc<ShmListener>,
    tokio::sync::watch::Sender<bool>,
    super::link::Link<super::HeapWriter>,
    super::link::Link<super::HeapReader>,
) {
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let listener = ShmListener::start(&tokio::runtime::Handle::current(), stop_rx, 8 << 20).unwrap();
    let token = [7u8; 32];
    let me: ShmOffer = super::local_offer(0).unwrap();
    let mut expected = listener.expect(token);
    let server_offer = listener.offer();
    let client = tokio::spawn(async move { connect_link(&server_offer, &token).await.unwrap() });
    let sock = expected.arrive().await;
    let server = serve_link(sock, &me, listener.heap_bytes()).await.unwrap();
    let client = client.await.unwrap();
    (listener, stop, server, client)
}

#[test]
fn a_link_carries_bytes_both_ways_and_ends_cleanly() {
    runtime().block_on(async {
        let (_l, _stop, (mut srd, mut swr, _), (mut crd, mut cwr, _)) = linked().await;
        // More than the ring holds, so the writer sleeps on a full ring and is woken.
        let data: Vec<u8> = (0..(9u64 << 20)).map(byte_at).collect();
        let expect = data.clone();
        let writer = tokio::spawn(async move {
            for chunk in data.chunks(100_003) {
                swr.write_all(chunk).await.unwrap();
            }
            swr.shutdown().await.unwrap();
            swr
        });
        let mut got = Vec::new();
        crd.read_to_end(&mut got).await.unwrap();
        assert!(
            got == expect,
            "the stream arrived changed ({} of {} bytes)",
            got.len(),
            expect.len()
        );
        cwr.write_all(b"credit").await.unwrap();
        let mut small = [0u8; 6];
        srd.read_exact(&mut small).await.unwrap();
        assert_eq!(&small, b"credit");
        drop(writer.await.unwrap());
    });
}

/// A record the server places in the heap is the client's to read, at the place the server
/// names, in the client's own mapping; the server reuses the chunks only after the client let
/// go of them, and a client holding the record past the server's end still reads it.
#[test]
fn a_placed_record_is_read_in_the_peers_mapping_until_dropped() {
    runtime().block_on(async {
        let (_l, _stop, (srd, swr, heap_w), (_crd, _cwr, heap_r)) = linked().await;
        let (heap_w, heap_r) = (heap_w.unwrap(), heap_r.unwrap());
        let record: Vec<u8> = (0..300_000u64).map(byte_at).collect();
        let start = heap_w.place(0, false, record.len(), record.chunks(4096)).unwrap();
        let lease = std::sync::Arc::new(heap_r.lease(start, record.len() as u64).unwrap());
        let buf = lease.buffer(0, record.len()).unwrap();
        drop(lease);
        assert!(buf.as_slice() == &record[..]);
        let again = heap_w.place(0, false, record.len(), record.chunks(4096)).unwrap();
        assert_ne!(again, start, "chunks in use were placed again");
        drop((srd, swr, heap_w));
        assert!(
            buf.as_slice() == &record[..],
            "the record changed after the server's end"
        );
    });
}

#[test]
fn a_dropped_peer_ends_a_waiting_reader_and_writer_at_once() {
    runtime().block_on(async {
        let (_l, _stop, server, (mut crd, mut cwr, _)) = linked().await;
        let read = tokio::spawn(async move {
            let mut b = [0u8; 1];
            crd.read(&mut b).await
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(server);
        let r = tokio::time::timeout(Duration::from_secs(2), read)
            .await
            .expect("the reader woke")
            .unwrap();
        assert_eq!(r.unwrap_err().kind(), std::io::ErrorKind::ConnectionReset);
        // The writer fails too (now, or once the ring is full).
        let big = vec![0u8; 1 << 20];
        let w = tokio::time::timeout(Duration::from_secs(2), async {
            loop {
                if let Err(e) = cwr.write_all(&big).await {
                    return e;
                }
            }
        })
        .await
        .expect("the writer failed");
        assert_eq!(w.kind(), std::io::ErrorKind::ConnectionReset);
    });
}

/// Waits for `waiter`'s wait to end, at most `within`.
async fn woken(waiter: &mut Waiter, within: Duration) -> Result<(), tokio::time::error::Elapsed> {
    tokio::time::timeout(within, std::future::poll_fn(|cx| waiter.poll(cx))).await
}

#[test]
fn a_peer_that_rings_and_goes_at_once_is_seen_gone_by_the_next_wait() {
    // The wake-up bytes and the end come in one readiness; the drain that takes the bytes
    // with a short read does not read the end, and the next wait must still wake for it.
    runtime().block_on(async {
        let (a, b) = tokio::net::UnixStream::pair().unwrap();
        let (ours, theirs) = (Doorbell::new(a).unwrap(), Doorbell::new(b).unwrap());
        theirs.ring();
        theirs.ring();
        drop(theirs);
        let mut waiter = Waiter::new(ours.clone());
        for _ in 0..2 {
            woken(&mut waiter, Duration::from_secs(2))
                .await
                .expect("the wait woke");
            if ours.is_dead() {
                return;
            }
        }
        panic!("the peer's end was not seen");
    });
}

#[test]
fn a_wake_up_the_other_half_takes_still_wakes_the_half_it_was_for() {
    // Both halves of a side wait on one doorbell socket. The peer rings for the writing half
    // while the reading half, ready from an earlier ring, is about to drain: it takes that
    // byte before the runtime has looked at the socket, which is then no longer readable, so
    // no readiness ever comes for the writing half. Its wait must end all the same.
    runtime().block_on(async {
        let (a, b) = tokio::net::UnixStream::pair().unwrap();
        let (ours, theirs) = (Doorbell::new(a).unwrap(), Doorbell::new(b).unwrap());
        let mut reading = Waiter::new(ours.clone());
        let mut writing = Waiter::new(ours.clone());
        let mut idle = Context::from_waker(Waker::noop());
        assert!(reading.poll(&mut idle).is_pending());
        assert!(writing.poll(&mut idle).is_pending());
        // A ring the runtime sees: it readies both waits; the writing half takes the byte and
        // waits again.
        theirs.ring();
        woken(&mut writing, Duration::from_secs(5))
            .await
            .expect("a ring wakes the writing half");
        assert!(writing.poll(&mut idle).is_pending());
        // The ring for the writing half, drained by the reading half at once.
        theirs.ring();
        assert!(reading.poll(&mut idle).is_ready());
        woken(&mut writing, Duration::from_secs(5))
            .await
            .expect("the writing half slept through the ring meant for it");
    });
}

#[test]
fn a_client_claiming_another_pid_is_refused() {
    runtime().block_on(async {
        let (_stop, stop_rx) = tokio::sync::watch::channel(false);
        let listener = ShmListener::start(&tokio::runtime::Handle::current(), stop_rx, 8 << 20).unwrap();
        let token = [9u8; 32];
        let mut me = super::local_offer(0).unwrap();
        me.pid = me.pid.wrapping_add(1);
        let mut expected = listener.expect(token);
        let offer = listener.offer();
        let client = tokio::spawn(async move { connect_link(&offer, &token).await });
        let sock = expected.arrive().await;
        let err = serve_link(sock, &me, 0).await.err().expect("refused");
        assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied);
        assert!(client.await.unwrap().is_err(), "the client gets no region");
    });
}

#[test]
fn a_server_claiming_another_pid_is_refused() {
    runtime().block_on(async {
        let (_stop, stop_rx) = tokio::sync::watch::channel(false);
        let listener = ShmListener::start(&tokio::runtime::Handle::current(), stop_rx, 8 << 20).unwrap();
        let mut offer = listener.offer();
        offer.pid = offer.pid.wrapping_add(1);
        // The name is made from the pid, so connect by the real name with the wrong claim.
        let real = listener.offer();
        let err = async {
            let sock =
                tokio::net::UnixStream::connect(format!("\0creditflow-shm-{}-{:016x}", real.pid, real.key))
                    .await?;
            super::link::check_peer(&sock, offer.pid)
        }
        .await
        .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied);
    });
}
