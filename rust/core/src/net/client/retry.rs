//! Partition requests answered PartitionNotFound: asked again after a backoff that doubles up
//! to its maximum, then the channel fails.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::state::{ClientConn, RemoteChannel};
use crate::base::config::Backoff;
use crate::base::error::Error;

/// The delay before the next partition request after one was answered PartitionNotFound:
/// `initial`, doubling up to `max`; `None` once a request at `max` failed (give up). `last` is
/// the delay used before the failed request (`None` for the first request).
pub(crate) fn next_retry_delay(last: Option<Duration>, backoff: Backoff) -> Option<Duration> {
    match last {
        None => Some(backoff.initial),
        Some(d) if d >= backoff.max => None,
        Some(d) => Some((d * 2).min(backoff.max)),
    }
}

/// The partition is not registered at the peer yet: ask again after the backoff, or fail.
pub(super) fn schedule_retry(conn: &Arc<ClientConn>, ch: Arc<RemoteChannel>) {
    let delay = {
        let mut retry = ch.retry.lock().unwrap();
        let Some(next) = next_retry_delay(*retry, ch.backoff) else {
            drop(retry);
            conn.remove(ch.rid);
            let id = ch.spec.partition_id.clone();
            ch.fail(Error::PartitionNotFound(id));
            return;
        };
        *retry = Some(next);
        next
    };
    let conn = conn.clone();
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        if !ch.released.load(Ordering::SeqCst) && conn.channel(ch.rid).is_some() {
            conn.send(ch.request());
            // A size announced before the sender knew the channel was dropped there.
            match ch.buffer_size.load(Ordering::Relaxed) {
                0 => {}
                size => ch.announce_buffer_size(size),
            }
        }
    });
}
