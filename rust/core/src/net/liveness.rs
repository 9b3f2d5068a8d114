//! Noticing a dead link: a peer that stops acknowledging (cable cut, host gone, a network
//! partition) makes TCP retransmit for many minutes before it gives up. Every connection gets
//! `TCP_USER_TIMEOUT` (data unacknowledged for longer fails the connection) and TCP keepalive
//! probes (so an idle connection, such as one whose sender waits for credit, is checked too),
//! so the affected gates and writers fail with `ConnectionLost` within about `peer_timeout`.
//! The kernel answers the probes, so a slow but live peer is never taken for dead.

use std::time::Duration;

use socket2::{SockRef, TcpKeepalive};

/// Applies `timeout` to `stream` (zero: leave the operating system's defaults).
pub(crate) fn set_peer_timeout(stream: &tokio::net::TcpStream, timeout: Duration) {
    if timeout.is_zero() {
        return;
    }
    let sock = SockRef::from(stream);
    let second = Duration::from_secs(1);
    let keepalive = TcpKeepalive::new()
        .with_time((timeout / 3).max(second))
        .with_interval((timeout / 6).max(second))
        .with_retries(3);
    if let Err(e) = sock
        .set_tcp_keepalive(&keepalive)
        .and_then(|()| sock.set_tcp_user_timeout(Some(timeout)))
    {
        log::warn!("creditflow: cannot set peer_timeout on a connection: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_socket_options_are_set() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let stream = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        set_peer_timeout(&stream, Duration::from_secs(6));
        let sock = SockRef::from(&stream);
        assert_eq!(sock.tcp_user_timeout().unwrap(), Some(Duration::from_secs(6)));
        assert!(sock.keepalive().unwrap());
        assert_eq!(sock.tcp_keepalive_time().unwrap(), Duration::from_secs(2));
        assert_eq!(sock.tcp_keepalive_interval().unwrap(), Duration::from_secs(1));
    }
}
