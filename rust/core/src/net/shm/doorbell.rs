//! The doorbell: a connected Unix socket between the two processes of a link. A side that
//! made progress the other waits for writes one byte; a side that sleeps waits for the socket
//! to become readable. It also tells a dead peer: when the peer's process ends, however it
//! ends, the kernel closes its end and this side reads end-of-file.

use std::future::Future;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream as StdUnixStream;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::net::UnixStream;
use tokio::sync::Notify;

/// One side's end of the doorbell socket, shared by its reader and writer halves.
pub(crate) struct Doorbell {
    /// Watched for readability only: each time the peer takes a wake-up byte this end
    /// becomes writable again, which would otherwise wake this side's runtime for nothing
    /// after every ring.
    sock: AsyncFd<StdUnixStream>,
    /// Told when a half took wake-up bytes (or saw the end): some may have been the other
    /// half's (see [`Waiter`]).
    taken: Notify,
    dead: AtomicBool,
}

impl Doorbell {
    /// The doorbell on `sock`, watched by the runtime of the calling context.
    pub(crate) fn new(sock: UnixStream) -> std::io::Result<Arc<Doorbell>> {
        let sock = sock.into_std()?;
        // SAFETY: the socket owns its descriptor, which stays open and the same until the
        // `AsyncFd` (its only owner) drops it.
        let sock = unsafe { AsyncFd::register_with_interest(sock, Interest::READABLE) }?;
        Ok(Arc::new(Doorbell {
            sock,
            taken: Notify::new(),
            dead: AtomicBool::new(false),
        }))
    }

    /// Wakes the peer. A full socket buffer already holds wake-ups the peer has not taken,
    /// so a byte that does not fit is not needed.
    pub(crate) fn ring(&self) {
        match self.sock.get_ref().write(&[1]) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => self.dead.store(true, Ordering::SeqCst),
        }
    }

    /// Takes the pending wake-up bytes; notes end-of-file (the peer is gone). A short read
    /// took them all: a byte or an end that comes later makes the socket ready again (an end
    /// that came with the bytes stays ready), so no second read is spent to be told so.
    /// Returns whether it took a byte or saw the end.
    fn drain(&self) -> bool {
        let mut buf = [0u8; 256];
        let mut took = false;
        loop {
            match self.sock.get_ref().read(&mut buf) {
                Ok(0) => {
                    self.dead.store(true, Ordering::SeqCst);
                    return true;
                }
                Ok(n) if n < buf.len() => return true,
                Ok(_) => took = true,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return took,
                Err(_) => {
                    self.dead.store(true, Ordering::SeqCst);
                    return true;
                }
            }
        }
    }

    /// Whether the peer's end is closed (its process ended or it dropped the link).
    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::SeqCst)
    }
}

/// A half's wait for the doorbell. Register first (`poll` returning `Pending`), then say
/// "waiting" in the ring and re-check: a wake-up after the registration is not lost.
///
/// Both halves of a side read the one socket, and a byte does not say whom it is for: a half
/// that drains may take the other's byte. Readiness does not cover that: the runtime learns of
/// a byte from an edge-triggered event it collects later, and an event whose bytes are gone by
/// then is not reported (the socket is no longer readable), so the half the byte was for would
/// sleep on. So a half that took bytes tells the other through [`Doorbell::taken`], for which
/// every wait registers too: the other half wakes and re-checks its ring.
pub(crate) struct Waiter {
    bell: Arc<Doorbell>,
    wait: Option<Pin<Box<dyn Future<Output = Woken> + Send>>>,
}

/// What ended a wait.
enum Woken {
    /// The socket became readable (or the registration failed: the caller re-checks).
    Socket,
    /// The other half took wake-up bytes.
    OtherHalf,
}

impl Waiter {
    pub(crate) fn new(bell: Arc<Doorbell>) -> Waiter {
        Waiter { bell, wait: None }
    }

    pub(crate) fn bell(&self) -> &Arc<Doorbell> {
        &self.bell
    }

    /// `Ready` when the doorbell may have rung (or the peer is gone): the caller re-checks
    /// its condition. `Pending`: registered for the next ring.
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let wait = self.wait.get_or_insert_with(|| {
            let bell = self.bell.clone();
            Box::pin(async move {
                // Registered for the other half's drain before the socket is looked at, and
                // both before this poll returns, so before the caller says it waits.
                let taken = bell.taken.notified();
                tokio::pin!(taken);
                taken.as_mut().enable();
                tokio::select! {
                    biased;
                    () = &mut taken => Woken::OtherHalf,
                    ready = bell.sock.readable() => {
                        // Cleared before the caller drains: a byte that comes after is seen again.
                        if let Ok(mut ready) = ready {
                            ready.clear_ready();
                        }
                        Woken::Socket
                    }
                }
            })
        });
        match wait.as_mut().poll(cx) {
            Poll::Ready(woken) => {
                self.wait = None;
                if matches!(woken, Woken::Socket) && self.bell.drain() {
                    self.bell.taken.notify_waiters();
                }
                Poll::Ready(())
            }
            Poll::Pending => Poll::Pending,
        }
    }
}
