//! Limits against abusive peers on the serving side: how many connections an environment
//! serves at once, how many channels (partition requests) one connection may read, and how
//! many answers to a connection's requests may wait unwritten. Each limit hit sends that
//! peer an ErrorResponse of kind [`ErrorKind::LimitExceeded`] naming the limit and its
//! setting; other peers are not affected.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::io;
use crate::base::config::Limits;
use crate::base::error::Error;
use crate::protocol::wire::{ErrorKind, Message};

/// The errors a peer gets when it hits a limit: each names the limit and its setting.
impl Limits {
    pub(crate) fn connections_error(&self) -> Error {
        Error::LimitExceeded(format!(
            "the environment already serves {0} connections, its limit (max_connections={0}); \
             retry later or raise max_connections on the serving environment",
            self.max_connections
        ))
    }

    pub(crate) fn channels_error(&self) -> Error {
        Error::LimitExceeded(format!(
            "this connection already reads {0} channels, the limit per connection \
             (max_channels_per_connection={0} on the serving environment)",
            self.max_channels_per_connection
        ))
    }

    pub(crate) fn outstanding_error(&self) -> Error {
        Error::LimitExceeded(format!(
            "{0} answers to this connection's requests are waiting to be read, the limit \
             (max_outstanding_requests={0} on the serving environment); the peer sends requests \
             but does not read the answers",
            self.max_outstanding_requests
        ))
    }
}

/// Counts connections in use; a [`Slot`] gives one back when dropped.
#[derive(Clone, Default)]
pub(crate) struct Slots(Arc<AtomicUsize>);

/// One taken slot of a [`Slots`].
pub(crate) struct Slot(Arc<AtomicUsize>);

impl Slots {
    /// A slot, unless `max` are taken.
    pub(crate) fn try_take(&self, max: usize) -> Option<Slot> {
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot(self.0.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Refusals being sent at once; beyond this a connection over the limit is closed without one.
pub(crate) const MAX_REFUSALS: usize = 64;
/// How long a refusal may take (write it, then see the peer close).
const REFUSAL_GRACE: Duration = Duration::from_secs(1);

/// Sends `error` as a fatal ErrorResponse, closes our side and reads (discarding) until the
/// peer closes too, so that the kernel does not reset the connection over unread bytes (the
/// peer's Hello) and discard the refusal before the peer reads it.
pub(crate) async fn refuse(mut stream: TcpStream, error: &Error) {
    let msg = Message::error_response(None, ErrorKind::of(error), &error.to_string());
    let _ = tokio::time::timeout(REFUSAL_GRACE, async {
        if io::write_message(&mut stream, &msg).await.is_ok() {
            let _ = stream.shutdown().await;
            let mut scratch = [0u8; 1024];
            while matches!(stream.read(&mut scratch).await, Ok(n) if n > 0) {}
        }
    })
    .await;
}

/// Writes a fatal ErrorResponse for `error` (best effort, bounded by [`REFUSAL_GRACE`]).
pub(crate) async fn send_fatal<W: AsyncWrite + Unpin>(w: &mut W, error: &Error) {
    let msg = Message::error_response(None, ErrorKind::of(error), &error.to_string());
    let _ = tokio::time::timeout(REFUSAL_GRACE, io::write_message(w, &msg)).await;
}
