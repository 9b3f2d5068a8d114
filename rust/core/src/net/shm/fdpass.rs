//! One message with descriptors over a Unix socket (`SCM_RIGHTS`): how a side that created a
//! shared region hands it to the other, with the few bytes that say how it is laid out.

use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage,
    SendFlags,
};
use tokio::io::Interest;
use tokio::net::UnixStream;

/// Most descriptors one message carries.
const MAX_FDS: usize = 2;

/// Sends `bytes` (all of them, in one message) with `fd` attached.
pub(crate) async fn send_fd(sock: &UnixStream, bytes: &[u8], fd: BorrowedFd<'_>) -> std::io::Result<()> {
    send_fds(sock, bytes, &[fd]).await
}

/// Sends `bytes` (all of them, in one message) with `fds` (at most two) attached.
pub(crate) async fn send_fds(sock: &UnixStream, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> std::io::Result<()> {
    assert!(!fds.is_empty() && fds.len() <= MAX_FDS, "one or two descriptors");
    sock.async_io(Interest::WRITABLE, || {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        control.push(SendAncillaryMessage::ScmRights(fds));
        let n = rustix::net::sendmsg(sock, &[IoSlice::new(bytes)], &mut control, SendFlags::NOSIGNAL)?;
        if n != bytes.len() {
            return Err(std::io::Error::other(
                "short write of a message with a descriptor",
            ));
        }
        Ok(())
    })
    .await
}

/// Receives one message of exactly `buf.len()` bytes with a descriptor attached; an error
/// naming `what` when the peer sent something else (or closed).
pub(crate) async fn recv_fd(sock: &UnixStream, buf: &mut [u8], what: &str) -> std::io::Result<OwnedFd> {
    let mut fds = recv_fds(sock, buf, 1, what).await?;
    Ok(fds.remove(0))
}

/// Receives one message of exactly `buf.len()` bytes with exactly `n` descriptors attached
/// (at most two); an error naming `what` when the peer sent something else (or closed).
pub(crate) async fn recv_fds(
    sock: &UnixStream,
    buf: &mut [u8],
    n: usize,
    what: &str,
) -> std::io::Result<Vec<OwnedFd>> {
    assert!(n > 0 && n <= MAX_FDS, "one or two descriptors");
    loop {
        sock.readable().await?;
        let got = sock.try_io(Interest::READABLE, || {
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
            let mut control = RecvAncillaryBuffer::new(&mut space);
            let mut iov = [std::io::IoSliceMut::new(buf)];
            let msg = rustix::net::recvmsg(sock, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC)?;
            // Descriptors beyond what was asked for are closed as they drop.
            let mut fds = Vec::new();
            for m in control.drain() {
                if let RecvAncillaryMessage::ScmRights(got) = m {
                    fds.extend(got);
                }
            }
            Ok((msg.bytes, fds))
        });
        match got {
            Ok((got, fds)) if got == buf.len() && fds.len() == n => return Ok(fds),
            Ok((got, fds)) => {
                return Err(std::io::Error::other(format!(
                    "the peer sent {got} bytes and {} descriptors instead of {what}",
                    fds.len()
                )))
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
}
