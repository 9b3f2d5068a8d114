//! A link's two rings as the byte-stream halves the connection code reads frames from and
//! writes frames to, like a TCP socket's: `ShmReader` (an `AsyncRead` and a
//! [`FrameSource`](crate::net::io::FrameSource)) and `ShmWriter` (an `AsyncWrite`).

use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::doorbell::{Doorbell, Waiter};
use super::ring::Ring;
use crate::base::byte_ring::ReaderState;
use crate::net::io::FrameSource;

fn peer_gone() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::ConnectionReset,
        "the peer's end of the shared-memory link closed (its process ended?)",
    )
}

/// The reading half: the ring the peer writes.
pub(crate) struct ShmReader {
    ring: Ring,
    waiter: Waiter,
}

impl ShmReader {
    pub(crate) fn new(ring: Ring, bell: Arc<Doorbell>) -> ShmReader {
        ShmReader {
            ring,
            waiter: Waiter::new(bell),
        }
    }

    /// `Ready(Ok(true))` once bytes are readable, `Ready(Ok(false))` at a clean end of
    /// stream, an error when the peer is gone with nothing left to read.
    fn poll_data(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<bool>> {
        loop {
            match self.ring.reader_state()? {
                ReaderState::Data => return Poll::Ready(Ok(true)),
                ReaderState::Closed => return Poll::Ready(Ok(false)),
                ReaderState::Empty => {}
            }
            if self.waiter.bell().is_dead() {
                return Poll::Ready(Err(peer_gone()));
            }
            if self.waiter.poll(cx).is_ready() {
                continue;
            }
            self.ring.set_reader_waiting();
            if self.ring.reader_state()? != ReaderState::Empty || self.waiter.bell().is_dead() {
                continue;
            }
            return Poll::Pending;
        }
    }

    fn pop(&mut self, dst: &mut [MaybeUninit<u8>]) -> std::io::Result<usize> {
        let n = self.ring.pop(dst)?;
        if n > 0 && self.ring.take_writer_waiting() {
            self.waiter.bell().ring();
        }
        Ok(n)
    }
}

impl AsyncRead for ShmReader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        if !std::task::ready!(this.poll_data(cx))? {
            return Poll::Ready(Ok(()));
        }
        // SAFETY: `pop` initializes exactly the `n` bytes it reports before `assume_init`.
        let n = this.pop(unsafe { buf.unfilled_mut() })?;
        // SAFETY: see above.
        unsafe { buf.assume_init(n) };
        buf.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl FrameSource for ShmReader {
    /// The rest of a payload and what follows it in one go, without waiting for the second.
    fn poll_read_two(
        &mut self,
        cx: &mut Context<'_>,
        first: &mut [MaybeUninit<u8>],
        second: &mut [u8],
    ) -> Poll<std::io::Result<(usize, usize)>> {
        if !std::task::ready!(self.poll_data(cx))? {
            return Poll::Ready(Ok((0, 0)));
        }
        let a = self.pop(first)?;
        let b = if a == first.len() && !second.is_empty() {
            // SAFETY: initialized bytes viewed as possibly uninitialized; `pop` only writes
            // initialized bytes into them.
            self.pop(unsafe { &mut *(second as *mut [u8] as *mut [MaybeUninit<u8>]) })?
        } else {
            0
        };
        Poll::Ready(Ok((a, b)))
    }
}

/// The writing half: the ring the peer reads.
pub(crate) struct ShmWriter {
    ring: Ring,
    waiter: Waiter,
}

impl ShmWriter {
    pub(crate) fn new(ring: Ring, bell: Arc<Doorbell>) -> ShmWriter {
        ShmWriter {
            ring,
            waiter: Waiter::new(bell),
        }
    }
}

impl ShmWriter {
    /// Writes all of `parts` now if the ring has room for all of them, else nothing (`false`):
    /// a frame goes whole or not at all, without waiting. Wakes the reader if it sleeps.
    pub(crate) fn try_write_whole(&mut self, parts: &[IoSlice<'_>]) -> std::io::Result<bool> {
        if self.waiter.bell().is_dead() || self.ring.is_closed() {
            return Err(peer_gone());
        }
        let need: usize = parts.iter().map(|p| p.len()).sum();
        if self.ring.writable()? < need {
            return Ok(false);
        }
        let n = self.ring.push(parts)?;
        debug_assert_eq!(n, need, "the ring had room for every byte");
        if n > 0 && self.ring.take_reader_waiting() {
            self.waiter.bell().ring();
        }
        Ok(true)
    }
}

impl AsyncWrite for ShmWriter {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if bufs.iter().all(|b| b.is_empty()) {
            return Poll::Ready(Ok(0));
        }
        let need: usize = bufs.iter().map(|b| b.len()).sum();
        loop {
            if this.waiter.bell().is_dead() || this.ring.is_closed() {
                return Poll::Ready(Err(peer_gone()));
            }
            if this.ring.may_write(need)? {
                let n = this.ring.push(bufs)?;
                if n > 0 {
                    if this.ring.take_reader_waiting() {
                        this.waiter.bell().ring();
                    }
                    return Poll::Ready(Ok(n));
                }
            }
            if this.waiter.poll(cx).is_ready() {
                continue;
            }
            this.ring.set_writer_waiting();
            if this.ring.may_write(need)? || this.waiter.bell().is_dead() {
                continue;
            }
            return Poll::Pending;
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    /// Closes the ring: the peer reads what is in it, then end-of-stream.
    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.ring.close();
        self.waiter.bell().ring();
        Poll::Ready(Ok(()))
    }
}
