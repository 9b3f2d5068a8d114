//! One connection to a remote environment ([`ClientConn`]), shared by every remote channel of
//! every gate that reads from it: connecting (TCP, then TLS if configured, then the
//! handshake), the writer half (PartitionRequests, AddCredits, cancellations, CloseRequest)
//! and failing every channel when the connection fails.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::Notify;

use super::read_loop::{read_loop, Items};
use super::state::{ClientConn, Inbox, Outbox, RemoteChannel, RemoteGate};
use crate::base::config::{Backoff, ChannelSpec};
use crate::base::error::{Error, Result};
use crate::net::handshake;
use crate::net::io::{self, FrameReader, FrameSource};
use crate::net::shm;
use crate::partition::subpartition::Listener;
use crate::protocol::wire::{self, ErrorKind, Message, ReceiverId};

impl ClientConn {
    pub(super) fn send(&self, msg: Message<'static>) {
        self.enqueue(|out| out.control.push_back(msg));
    }

    pub(super) fn request_credit(&self, rid: ReceiverId) {
        self.enqueue(|out| out.credit.push(rid));
    }

    pub(super) fn enqueue(&self, f: impl FnOnce(&mut Outbox)) {
        let wake = {
            let mut out = self.out.lock().unwrap();
            f(&mut out);
            !std::mem::replace(&mut out.woken, true)
        };
        self.writer_due.store(true, Ordering::Release);
        if wake {
            self.wake.notify_one();
        }
    }

    /// Whether the connection failed.
    pub(crate) fn is_dead(&self) -> bool {
        self.failure.lock().unwrap().is_some()
    }

    /// Asks the writer to send CloseRequest and stop.
    pub(crate) fn close(&self) {
        self.enqueue(|out| out.close = true);
    }

    /// Fails every channel of the connection, and any opened on it later.
    pub(super) fn fail(&self, error: Error) {
        let channels: Vec<Arc<RemoteChannel>> = {
            let mut channels = self.channels.lock().unwrap();
            *self.failure.lock().unwrap() = Some(error);
            channels.drain().map(|(_, c)| c).collect()
        };
        for ch in channels {
            ch.fail(self.failure().expect("set above"));
        }
    }

    /// The error a channel of the failed connection gets (also one opened after it failed);
    /// `None` while the connection is up.
    pub(super) fn failure(&self) -> Option<Error> {
        self.failure
            .lock()
            .unwrap()
            .as_ref()
            .map(|error| duplicate(error, &self.addr))
    }

    pub(super) fn channel(&self, rid: ReceiverId) -> Option<Arc<RemoteChannel>> {
        self.channels.lock().unwrap().get(&rid).cloned()
    }

    pub(super) fn remove(&self, rid: ReceiverId) -> Option<Arc<RemoteChannel>> {
        self.channels.lock().unwrap().remove(&rid)
    }

    /// Frames to write now, and whether to stop after them.
    pub(super) fn collect(&self) -> Result<(Vec<u8>, bool)> {
        let (control, credit, close) = {
            let mut out = self.out.lock().unwrap();
            out.woken = false;
            self.writer_due.store(false, Ordering::Release);
            (
                std::mem::take(&mut out.control),
                std::mem::take(&mut out.credit),
                out.close,
            )
        };
        let mut bytes = Vec::new();
        let limit = self.payload_limit.load(Ordering::Relaxed);
        for msg in &control {
            match *msg {
                Message::NewBufferSize { receiver, size } if limit > 0 && size as usize > limit => {
                    let size = limit.min(u32::MAX as usize) as u32;
                    wire::encode(&Message::NewBufferSize { receiver, size }, &mut bytes)?
                }
                _ => wire::encode(msg, &mut bytes)?,
            }
        }
        for rid in credit {
            let Some(ch) = self.channel(rid) else { continue };
            if let Some(credit) = ch.gate.take_credit(&ch) {
                wire::encode(
                    &Message::AddCredit {
                        receiver: rid,
                        credit,
                    },
                    &mut bytes,
                )?;
            }
        }
        if close {
            wire::encode(&Message::CloseRequest, &mut bytes)?;
        }
        Ok((bytes, close))
    }
}

/// The same error for another channel (errors are not `Clone`).
fn duplicate(error: &Error, addr: &str) -> Error {
    match error {
        Error::Authentication(m) => Error::Authentication(m.clone()),
        Error::Protocol(m) => Error::Protocol(format!("connection to {addr}: {m}")),
        Error::ConnectionLost(m) => Error::ConnectionLost(format!("connection to {addr}: {m}")),
        Error::LimitExceeded(m) => Error::LimitExceeded(format!("connection to {addr}: {m}")),
        other => Error::ConnectionLost(format!("connection to {addr}: {other}")),
    }
}

/// What a client connection needs from its environment.
#[derive(Clone)]
pub(crate) struct ClientContext {
    pub(crate) segment_size: usize,
    pub(crate) secret: Option<Vec<u8>>,
    pub(crate) handshake_timeout: Duration,
    /// TLS under the creditflow handshake; `None`: plaintext.
    pub(crate) tls: Option<Arc<crate::net::tls::Tls>>,
    /// See `liveness`; zero: OS defaults.
    pub(crate) peer_timeout: Duration,
    /// Offer shared memory to the server (`shared_memory` of the environment).
    pub(crate) shm: bool,
}

impl ClientConn {
    /// The state of a connection to `addr`, before anything connects it.
    pub(super) fn new(addr: String) -> Arc<ClientConn> {
        Arc::new(ClientConn {
            addr,
            out: Mutex::new(Outbox::default()),
            wake: Notify::new(),
            writer_due: AtomicBool::new(false),
            channels: Mutex::new(HashMap::new()),
            failure: Mutex::new(None),
            closed: Mutex::new(Vec::new()),
            payload_limit: Default::default(),
            shm: AtomicBool::new(false),
        })
    }

    /// A connection to `addr`, connecting in the background; messages queue meanwhile.
    pub(crate) fn open(addr: String, ctx: ClientContext, rt: &tokio::runtime::Handle) -> Arc<ClientConn> {
        let conn = ClientConn::new(addr.clone());
        let c = conn.clone();
        rt.spawn(async move {
            let result = match tokio::time::timeout(
                ctx.handshake_timeout,
                tokio::net::TcpStream::connect(&addr),
            )
            .await
            {
                Ok(Ok(stream)) => {
                    let _ = stream.set_nodelay(true);
                    log::debug!("connected to {addr}");
                    crate::net::liveness::set_peer_timeout(&stream, ctx.peer_timeout);
                    match &ctx.tls {
                        None => {
                            let (rd, wr) = stream.into_split();
                            run(&c, rd, wr, &ctx).await
                        }
                        Some(tls) => {
                            match tokio::time::timeout(ctx.handshake_timeout, tls.connect(&addr, stream))
                                .await
                            {
                                Ok(Ok((rd, wr))) => run(&c, rd, wr, &ctx).await,
                                Ok(Err(e)) => Err(e),
                                Err(_) => Err(Error::ConnectionLost(format!(
                                    "no TLS handshake within {:?}",
                                    ctx.handshake_timeout
                                ))),
                            }
                        }
                    }
                }
                Ok(Err(e)) => Err(Error::ConnectionLost(format!("cannot connect: {e}"))),
                Err(_) => Err(Error::ConnectionLost(format!(
                    "cannot connect: no answer within {:?}",
                    ctx.handshake_timeout
                ))),
            };
            let error = match result {
                Ok(()) => Error::ConnectionLost("closed".into()),
                Err(e) => e,
            };
            // Worth a warning only when it cuts channels off; after the last channel ended,
            // the producer closing its side is the normal end.
            let open = c.channels.lock().unwrap().len();
            if open > 0 {
                log::warn!("connection to {addr} failed with {open} channel(s) open: {error}");
            } else {
                log::debug!("connection to {addr} ended: {error}");
            }
            c.fail(error);
        });
        conn
    }

    /// Opens a channel on this connection and sends its PartitionRequest.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn open_channel(
        self: &Arc<Self>,
        rid: ReceiverId,
        spec: ChannelSpec,
        gate: &Arc<RemoteGate>,
        notify: Listener,
        backoff: Backoff,
    ) -> Arc<RemoteChannel> {
        let mut bufs = gate.bufs.lock().unwrap();
        let cid = bufs.credit.add_channel();
        let record_cid = bufs.records.add_channel();
        debug_assert_eq!(cid, record_cid);
        let ch = Arc::new(RemoteChannel {
            rid,
            cid,
            spec,
            gate: gate.clone(),
            conn: self.clone(),
            inbox: Mutex::new(Inbox {
                items: VecDeque::new(),
                done: false,
            }),
            notify,
            next_sequence: AtomicU64::new(0),
            retry: Mutex::new(None),
            backoff,
            released: AtomicBool::new(false),
            buffer_size: Default::default(),
        });
        bufs.channels.push(Arc::downgrade(&ch));
        drop(bufs);
        // Checked and inserted under the lock that `fail` drains: a channel is either failed
        // by `fail` or finds the connection's error here, never neither.
        let failure = {
            let mut channels = self.channels.lock().unwrap();
            let failure = self.failure();
            if failure.is_none() {
                channels.insert(rid, ch.clone());
            }
            failure
        };
        if let Some(error) = failure {
            ch.fail(error);
            return ch;
        }
        log::debug!(
            "{}: requesting {:?}[{}] as {rid}",
            self.addr,
            ch.spec.partition_id,
            ch.spec.subpartition
        );
        self.send(ch.request());
        ch
    }
}

async fn run<R, W>(conn: &Arc<ClientConn>, rd: R, mut wr: W, ctx: &ClientContext) -> Result<()>
where
    R: FrameSource,
    W: AsyncWrite + Unpin,
{
    let mut reader = FrameReader::new(rd);
    let offer = if ctx.shm { shm::local_offer(0) } else { None };
    let hs = handshake::client_handshake(
        &mut reader,
        &mut wr,
        ctx.segment_size,
        ctx.secret.as_deref(),
        offer,
    );
    let negotiated = match tokio::time::timeout(ctx.handshake_timeout, hs).await {
        Ok(r) => r?,
        Err(_) => {
            return Err(Error::ConnectionLost(format!(
                "no handshake within {:?}",
                ctx.handshake_timeout
            )))
        }
    };
    conn.payload_limit
        .store(negotiated.payload_limit, Ordering::Relaxed);
    if let Some((server, token)) = negotiated.shm {
        match tokio::time::timeout(ctx.handshake_timeout, shm::connect_link(&server, &token)).await {
            Ok(Ok((srd, swr, heap))) => {
                // The TCP connection has done its part (authentication); close it.
                drop((reader, wr));
                conn.shm.store(true, Ordering::Relaxed);
                log::debug!("connection to {} uses shared memory", conn.addr);
                let mut reader = FrameReader::new(srd);
                reader.set_max_frame_size(wire::max_frame_size(negotiated.payload_limit));
                return run_loops(conn, reader, swr, heap.map(Items::new)).await;
            }
            Ok(Err(e)) => log::info!(
                "connection to {}: no shared memory ({e}), staying on TCP",
                conn.addr
            ),
            Err(_) => log::info!(
                "connection to {}: no shared-memory link in time, staying on TCP",
                conn.addr
            ),
        }
    }
    run_loops(conn, reader, wr, None).await
}

/// The reader and writer loops of an authenticated connection over its byte stream (and a
/// shared-memory link's heap).
async fn run_loops<R, W>(
    conn: &Arc<ClientConn>,
    mut reader: FrameReader<R>,
    mut wr: W,
    items: Option<Items>,
) -> Result<()>
where
    R: FrameSource,
    W: AsyncWrite + Unpin,
{
    let result = tokio::select! {
        r = read_loop(conn, &mut reader, items) => r,
        r = write_loop(conn, &mut wr) => r,
    };
    if let Err(Error::Protocol(m)) = &result {
        let msg = Message::error_response(None, ErrorKind::Protocol, m);
        let _ = io::write_message(&mut wr, &msg).await;
    }
    result
}

async fn write_loop<W: AsyncWrite + Unpin>(conn: &Arc<ClientConn>, wr: &mut W) -> Result<()> {
    loop {
        let notified = conn.wake.notified();
        let (bytes, close) = conn.collect()?;
        if !bytes.is_empty() {
            wr.write_all(&bytes)
                .await
                .map_err(|e| Error::ConnectionLost(e.to_string()))?;
            // A TLS writer may hold sealed records until flushed.
            wr.flush()
                .await
                .map_err(|e| Error::ConnectionLost(e.to_string()))?;
        }
        if close {
            let _ = wr.shutdown().await;
            // Wait for the peer to close its side (the read loop ends the task).
            std::future::pending::<()>().await;
        }
        if bytes.is_empty() {
            notified.await;
        }
    }
}
