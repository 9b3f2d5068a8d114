//! Setting a link up, after the TCP handshake agreed on shared memory (both offered it, same
//! boot id, same uid):
//!
//! 1. The server environment listens on a Unix socket in the abstract namespace (no file, so
//!    nothing in `/dev/shm` or `/tmp` to open), named after its pid and a random key it
//!    announced in its Hello.
//! 2. The client connects, checks the socket's peer credentials (`SO_PEERCRED`: the server's
//!    pid and our uid), and sends the nonce of its Hello as the token naming its TCP
//!    connection.
//! 3. The server checks the peer credentials in turn (our uid, the client's pid from its
//!    Hello), creates a sealed `memfd` region with both rings and passes its descriptor
//!    (`SCM_RIGHTS`) with the layout. Both sides map it and close the descriptor; the socket
//!    stays open as the doorbell.
//!
//! A client that cannot connect (another network namespace, say) keeps using TCP; the server
//! then sees its next frame on TCP instead of a link.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{oneshot, watch};

use super::doorbell::Doorbell;
use super::fdpass::{recv_fd, send_fd};
use super::heap::{heap_region_len, sane_heap, HeapReader, HeapWriter};
use super::identity::local_offer;
use super::region::Region;
use super::ring::{Ring, RING_HEADER};
use super::stream::{ShmReader, ShmWriter};
use crate::protocol::wire::{Nonce, ShmOffer, NONCE_LEN};

/// Data bytes of the ring from server to client (buffers) and from client to server (credit
/// and requests). What is in flight is bounded by credit, not by these.
const SERVER_TO_CLIENT: usize = 4 << 20;
const CLIENT_TO_SERVER: usize = 256 << 10;
/// Links whose token arrived before their connection asked for it, at most.
const MAX_EARLY: usize = 64;
/// How long an accepted socket may take to send its token, and an early one may wait.
const TOKEN_TIMEOUT: Duration = Duration::from_secs(10);

fn socket_name(offer: &ShmOffer) -> String {
    format!("\0creditflow-shm-{}-{:016x}", offer.pid, offer.key)
}

fn refused(msg: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::PermissionDenied, msg)
}

/// Checks a link socket's peer: our uid, and the pid the peer announced in its Hello.
pub(crate) fn check_peer(sock: &UnixStream, pid: u32) -> std::io::Result<()> {
    let cred = sock.peer_cred()?;
    let uid = rustix::process::getuid().as_raw();
    if cred.uid() != uid {
        return Err(refused(format!(
            "shared-memory peer runs as uid {}, this process as {uid}",
            cred.uid()
        )));
    }
    if cred.pid() != Some(pid as i32) {
        return Err(refused(format!(
            "shared-memory peer is pid {:?}, its handshake said {pid}",
            cred.pid()
        )));
    }
    Ok(())
}

enum Pending {
    /// A served connection waits for its link.
    Waiting(oneshot::Sender<UnixStream>),
    /// The link came first.
    Arrived(UnixStream),
}

/// The server side's listener for links, one per environment.
pub(crate) struct ShmListener {
    offer: ShmOffer,
    pending: Mutex<HashMap<Nonce, Pending>>,
    /// Bytes of heap each link gets (0: none).
    heap: usize,
}

impl ShmListener {
    /// Listens (on the runtime of `handle`) until `shutdown`; an error where shared memory
    /// is not available. Each link gets `heap` bytes of heap (0: none).
    pub(crate) fn start(
        handle: &tokio::runtime::Handle,
        shutdown: watch::Receiver<bool>,
        heap: usize,
    ) -> std::io::Result<Arc<ShmListener>> {
        let mut key = [0u8; 8];
        getrandom::fill(&mut key).map_err(|e| std::io::Error::other(e.to_string()))?;
        let offer = local_offer(u64::from_le_bytes(key).max(1))
            .ok_or_else(|| std::io::Error::other("no boot id on this system"))?;
        let listener = {
            let _guard = handle.enter();
            UnixListener::bind(socket_name(&offer))?
        };
        let this = Arc::new(ShmListener {
            heap,
            offer,
            pending: Mutex::new(HashMap::new()),
        });
        handle.spawn(accept_loop(listener, Arc::downgrade(&this), shutdown));
        Ok(this)
    }

    /// Bytes of heap each link this listener sets up gets.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.heap
    }

    /// What this environment offers in its Hello.
    pub(crate) fn offer(&self) -> ShmOffer {
        self.offer
    }

    /// Waits for the link whose token is `token` (the client's Hello nonce).
    pub(crate) fn expect(self: &Arc<Self>, token: Nonce) -> Expected {
        let mut pending = self.pending.lock().unwrap();
        let (tx, rx) = oneshot::channel();
        let ready = match pending.remove(&token) {
            Some(Pending::Arrived(s)) => Some(s),
            _ => {
                pending.insert(token, Pending::Waiting(tx));
                None
            }
        };
        Expected {
            listener: self.clone(),
            token,
            rx,
            ready,
        }
    }

    fn deliver(self: &Arc<Self>, token: Nonce, sock: UnixStream) {
        let mut pending = self.pending.lock().unwrap();
        match pending.remove(&token) {
            Some(Pending::Waiting(tx)) => {
                let _ = tx.send(sock);
            }
            Some(Pending::Arrived(_)) => log::warn!("creditflow: a second shared-memory link with one token"),
            None => {
                let early = pending
                    .values()
                    .filter(|p| matches!(p, Pending::Arrived(_)))
                    .count();
                if early < MAX_EARLY {
                    pending.insert(token, Pending::Arrived(sock));
                    let this = Arc::downgrade(self);
                    tokio::spawn(async move {
                        tokio::time::sleep(TOKEN_TIMEOUT).await;
                        if let Some(this) = this.upgrade() {
                            let mut pending = this.pending.lock().unwrap();
                            if matches!(pending.get(&token), Some(Pending::Arrived(_))) {
                                pending.remove(&token);
                            }
                        }
                    });
                }
            }
        }
    }
}

/// A served connection's wait for its link; forgets the token when dropped.
pub(crate) struct Expected {
    listener: Arc<ShmListener>,
    token: Nonce,
    rx: oneshot::Receiver<UnixStream>,
    ready: Option<UnixStream>,
}

impl Expected {
    /// The link's socket, once the client connected (never, if it does not).
    pub(crate) async fn arrive(&mut self) -> UnixStream {
        if let Some(s) = self.ready.take() {
            return s;
        }
        match (&mut self.rx).await {
            Ok(s) => s,
            Err(_) => std::future::pending().await,
        }
    }
}

impl Drop for Expected {
    fn drop(&mut self) {
        let mut pending = self.listener.pending.lock().unwrap();
        if matches!(pending.get(&self.token), Some(Pending::Waiting(_))) {
            pending.remove(&self.token);
        }
    }
}

async fn accept_loop(listener: UnixListener, this: Weak<ShmListener>, mut shutdown: watch::Receiver<bool>) {
    let uid = rustix::process::getuid().as_raw();
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.wait_for(|c| *c) => return,
        };
        let Ok((mut sock, _)) = accepted else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let this = this.clone();
        tokio::spawn(async move {
            // Another user's process never gets as far as sending a token.
            match sock.peer_cred() {
                Ok(c) if c.uid() == uid => {}
                other => {
                    log::warn!("creditflow: refused a shared-memory link from {other:?}: not this user");
                    return;
                }
            }
            let mut token = [0u8; NONCE_LEN];
            if tokio::time::timeout(TOKEN_TIMEOUT, sock.read_exact(&mut token))
                .await
                .is_ok_and(|r| r.is_ok())
            {
                if let Some(this) = this.upgrade() {
                    this.deliver(token, sock);
                }
            }
        });
    }
}

/// Bytes of the layout a server sends with the descriptor.
const LAYOUT_LEN: usize = 24;

/// The layout a server sends with the descriptor: both rings' capacities and the heap's size.
fn layout_bytes(heap: usize) -> [u8; LAYOUT_LEN] {
    let mut b = [0u8; LAYOUT_LEN];
    b[..8].copy_from_slice(&(SERVER_TO_CLIENT as u64).to_le_bytes());
    b[8..16].copy_from_slice(&(CLIENT_TO_SERVER as u64).to_le_bytes());
    b[16..].copy_from_slice(&(heap as u64).to_le_bytes());
    b
}

/// Where the heap starts: after both rings.
pub(crate) fn heap_offset(s2c: usize, c2s: usize) -> usize {
    2 * RING_HEADER + s2c + c2s
}

/// Bytes of a region with both rings and a heap of `heap` bytes (0: none).
pub(crate) fn region_len(s2c: usize, c2s: usize, heap: usize) -> usize {
    heap_offset(s2c, c2s) + if heap > 0 { heap_region_len(heap) } else { 0 }
}

/// What a link gives either side: the reading and writing halves, and the heap if it has one
/// (the server places records in it, the client reads them there).
pub(crate) type Link<H> = (ShmReader, ShmWriter, Option<H>);

/// Server side: checks the client's credentials, creates the region and passes it.
/// `heap`: bytes of the link's heap ([`super::heap_bytes_for`]; 0 for none).
pub(crate) async fn serve_link(
    sock: UnixStream,
    client: &ShmOffer,
    heap: usize,
) -> std::io::Result<Link<HeapWriter>> {
    check_peer(&sock, client.pid)?;
    let (region, fd) = Region::create(region_len(SERVER_TO_CLIENT, CLIENT_TO_SERVER, heap))?;
    let layout = layout_bytes(heap);
    send_fd(&sock, &layout, fd.as_fd()).await?;
    drop(fd);
    let region = Arc::new(region);
    let to_client = Ring::new(region.clone(), 0, SERVER_TO_CLIENT);
    let from_client = Ring::new(region.clone(), RING_HEADER + SERVER_TO_CLIENT, CLIENT_TO_SERVER);
    let offset = heap_offset(SERVER_TO_CLIENT, CLIENT_TO_SERVER);
    let heap = (heap > 0).then(|| HeapWriter::new(region, offset, heap));
    let bell = Doorbell::new(sock)?;
    Ok((
        ShmReader::new(from_client, bell.clone()),
        ShmWriter::new(to_client, bell),
        heap,
    ))
}

/// Client side: connects to the server's listener, checks its credentials, sends the token
/// and maps the region it gets.
pub(crate) async fn connect_link(server: &ShmOffer, token: &Nonce) -> std::io::Result<Link<HeapReader>> {
    let mut sock = UnixStream::connect(socket_name(server)).await?;
    check_peer(&sock, server.pid)?;
    sock.write_all(token).await?;
    let mut layout = [0u8; LAYOUT_LEN];
    let fd = recv_fd(&sock, &mut layout, "a shared-memory layout").await?;
    let s2c = u64::from_le_bytes(layout[..8].try_into().expect("8 bytes")) as usize;
    let c2s = u64::from_le_bytes(layout[8..16].try_into().expect("8 bytes")) as usize;
    let heap = u64::from_le_bytes(layout[16..].try_into().expect("8 bytes")) as usize;
    let sane = |n: usize| n.is_power_of_two() && (4096..=1 << 30).contains(&n);
    if !sane(s2c) || !sane(c2s) || !sane_heap(heap) {
        return Err(std::io::Error::other(format!(
            "bad shared-memory layout {s2c}/{c2s}/{heap}"
        )));
    }
    let region = Arc::new(Region::map(&fd, region_len(s2c, c2s, heap))?);
    drop(fd);
    let from_server = Ring::new(region.clone(), 0, s2c);
    let to_server = Ring::new(region.clone(), RING_HEADER + s2c, c2s);
    let heap = (heap > 0).then(|| HeapReader::new(region, heap_offset(s2c, c2s), heap));
    let bell = Doorbell::new(sock)?;
    Ok((
        ShmReader::new(from_server, bell.clone()),
        ShmWriter::new(to_server, bell),
        heap,
    ))
}
