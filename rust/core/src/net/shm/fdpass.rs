//! One message with one descriptor over a Unix socket (`SCM_RIGHTS`): how a side that created
//! a shared region hands it to the other, with the few bytes that say how it is laid out.

use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage,
    SendFlags,
};
use tokio::io::Interest;
use tokio::net::UnixStream;

/// Sends `bytes` (all of them, in one message) with `fd` attached.
pub(crate) async fn send_fd(sock: &UnixStream, bytes: &[u8], fd: BorrowedFd<'_>) -> std::io::Result<()> {
    sock.async_io(Interest::WRITABLE, || {
        let fds = [fd];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        control.push(SendAncillaryMessage::ScmRights(&fds));
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
    loop {
        sock.readable().await?;
        let got = sock.try_io(Interest::READABLE, || {
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
            let mut control = RecvAncillaryBuffer::new(&mut space);
            let mut iov = [std::io::IoSliceMut::new(buf)];
            let msg = rustix::net::recvmsg(sock, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC)?;
            let mut fd = None;
            for m in control.drain() {
                if let RecvAncillaryMessage::ScmRights(fds) = m {
                    for f in fds {
                        // More than one descriptor: keep the first, close the rest.
                        fd.get_or_insert(f);
                    }
                }
            }
            Ok((msg.bytes, fd))
        });
        match got {
            Ok((n, Some(fd))) if n == buf.len() => return Ok(fd),
            Ok((n, _)) => {
                return Err(std::io::Error::other(format!(
                    "the peer sent {n} bytes and no region instead of {what}"
                )))
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
}
