//! Serving one accepted connection: the handshake, then the reader half (requests) and the
//! writer half (the sender loop) until either ends.

use std::io::IoSlice;
use std::sync::{Arc, Mutex, Weak};

use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::Notify;

use super::conn::{ServerConn, ServerState};
use crate::base::config::Limits;
use crate::base::error::{Error, Result};
use crate::net::handshake;
use crate::net::io::{self, FrameReader, FrameSource, InFrame};
use crate::net::limits::{self, Slot};
use crate::net::shm::{self, ChannelTransport, HeapWriter, ShmListener};
use crate::partition::Registry;
use crate::protocol::wire::{self, Message};
use crate::serde::Compression;

/// Serves one accepted, not yet authenticated connection until it ends.
pub(crate) async fn serve<R, W>(rd: R, mut wr: W, peer: String, ctx: ServeContext)
where
    R: FrameSource,
    W: AsyncWrite + Unpin,
{
    let mut reader = FrameReader::new(rd);
    let offer = ctx.shm.as_ref().map(|l| l.offer());
    let hs = handshake::server_handshake(
        &mut reader,
        &mut wr,
        ctx.segment_size,
        ctx.secret.as_deref(),
        offer,
    );
    let negotiated = match tokio::time::timeout(ctx.handshake_timeout, hs).await {
        Ok(Ok(n)) => n,
        Ok(Err(e)) => {
            log::warn!("creditflow: refused connection from {peer}: {e}");
            return;
        }
        Err(_) => {
            log::warn!(
                "creditflow: dropped connection from {peer}: no handshake within {:?}",
                ctx.handshake_timeout
            );
            return;
        }
    };
    if let (Some((client, token)), Some(listener)) = (negotiated.shm, ctx.shm.clone()) {
        // The client either links up (then sends nothing more on TCP) or stays on TCP (its
        // first request comes on TCP).
        let mut expected = listener.expect(token);
        let mut shutdown = ctx.shutdown.clone();
        let link = tokio::select! {
            biased;
            sock = expected.arrive() => Some(sock),
            r = reader.wait_readable() => match r {
                Ok(()) => None,
                Err(e) => {
                    log::info!("creditflow: connection from {peer} ended: {e}");
                    return;
                }
            },
            _ = shutdown.wait_for(|c| *c) => return,
        };
        if let Some(sock) = link {
            match shm::serve_link(sock, &client, listener.heap_bytes()).await {
                Ok((srd, swr, heap)) => {
                    drop((reader, wr));
                    let mut reader = FrameReader::new(srd);
                    reader.set_max_frame_size(wire::max_frame_size(negotiated.payload_limit));
                    log::debug!("creditflow: connection from {peer} uses shared memory");
                    let link = (ChannelTransport::Shm, heap);
                    return serve_conn(reader, swr, peer, link, ctx, negotiated).await;
                }
                Err(e) => {
                    log::warn!("creditflow: shared-memory link from {peer} failed: {e}");
                    return;
                }
            }
        }
    }
    serve_conn(reader, wr, peer, (ChannelTransport::Tcp, None), ctx, negotiated).await
}

/// Serves an authenticated connection over its byte stream (TCP, TLS or shared memory; a
/// shared-memory link comes with its heap).
async fn serve_conn<R, W>(
    mut reader: FrameReader<R>,
    mut wr: W,
    peer: String,
    (transport, heap): (ChannelTransport, Option<HeapWriter>),
    ctx: ServeContext,
    negotiated: handshake::Negotiated,
) where
    R: FrameSource,
    W: AsyncWrite + Unpin,
{
    let conn = Arc::new(ServerConn {
        peer: peer.clone(),
        transport,
        payload_limit: negotiated.payload_limit,
        limits: ctx.limits,
        wire_compression: ctx.wire_compression,
        registry: ctx.registry,
        state: Mutex::new(ServerState::default()),
        signalled: Mutex::new(Vec::new()),
        wake: Notify::new(),
        closing: Default::default(),
        heap,
    });
    ctx.served.lock().unwrap().push(Arc::downgrade(&conn));
    let mut shutdown = ctx.shutdown.clone();
    let mut closing = false;
    let result = {
        let writer = write_loop(&conn, &mut wr);
        tokio::pin!(writer);
        let r = tokio::select! {
            r = read_loop(&conn, &mut reader) => Some(r),
            r = &mut writer => Some(r),
            _ = shutdown.wait_for(|c| *c) => None,
        };
        match r {
            Some(r) => r,
            None => {
                // The environment closes: finish the write in progress and whatever is
                // queued (last buffers, end-of-partition events), then close our side.
                closing = true;
                conn.closing.store(true, std::sync::atomic::Ordering::SeqCst);
                conn.wake.notify_one();
                tokio::time::timeout(CLOSE_FLUSH, &mut writer)
                    .await
                    .unwrap_or(Ok(()))
            }
        }
    };
    if closing && result.is_ok() {
        // FIN, then read until the peer closes too: closing with its AddCredits unread
        // would make the kernel send a reset, which can discard data the peer has not read.
        let _ = wr.shutdown().await;
        let _ = tokio::time::timeout(CLOSE_FLUSH, async {
            while let Ok(frame) = reader.next().await {
                if let InFrame::Data(_) = frame {
                    break;
                }
            }
        })
        .await;
    }
    match &result {
        Ok(()) => {
            log::debug!("creditflow: connection from {peer} closed");
            conn.shutdown(None);
        }
        Err(e) => {
            if matches!(e, Error::Protocol(_) | Error::LimitExceeded(_)) {
                log::warn!("creditflow: closing connection from {peer}: {e}");
                limits::send_fatal(&mut wr, e).await;
            } else {
                log::info!("creditflow: connection from {peer} ended: {e}");
            }
            conn.shutdown(Some(e));
        }
    }
    drop(ctx.slot);
}

/// What a served connection needs from its environment.
pub(crate) struct ServeContext {
    pub(crate) segment_size: usize,
    pub(crate) secret: Option<Vec<u8>>,
    pub(crate) handshake_timeout: std::time::Duration,
    pub(crate) limits: Limits,
    /// This connection's place under `max_connections`, held until it ends.
    pub(crate) slot: Slot,
    /// IPC body compression of handed-off batches encoded for the peer.
    pub(crate) wire_compression: Option<Compression>,
    pub(crate) registry: Weak<Registry>,
    pub(crate) shutdown: tokio::sync::watch::Receiver<bool>,
    pub(crate) served: Arc<Mutex<Vec<Weak<ServerConn>>>>,
    /// Shared-memory links this environment offers; `None`: TCP only.
    pub(crate) shm: Option<Arc<ShmListener>>,
}

/// How long a closing connection may take to write what is queued, and to see the peer close.
pub(super) const CLOSE_FLUSH: std::time::Duration = std::time::Duration::from_millis(1000);

pub(super) async fn read_loop<R: FrameSource>(
    conn: &Arc<ServerConn>,
    reader: &mut FrameReader<R>,
) -> Result<()> {
    loop {
        let msg = match reader.next().await {
            Ok(InFrame::Message(m)) => m,
            Ok(InFrame::Data(_)) => {
                return Err(Error::Protocol("a client sent a data buffer".into()));
            }
            Err(e) => return Err(e),
        };
        match msg {
            Message::PartitionRequest {
                partition_id,
                subpartition,
                receiver,
                initial_credit,
            } => {
                conn.on_partition_request(partition_id, subpartition, receiver, initial_credit)?;
                // Answers pile up: let the writer (polled with this loop) send them first.
                if conn.outstanding() > conn.limits.max_outstanding_requests / 2 {
                    tokio::task::yield_now().await;
                }
            }
            Message::AddCredit { receiver, credit } => conn.on_add_credit(receiver, credit)?,
            Message::RecordGrant { receiver, bytes } => conn.on_record_grant(receiver, bytes)?,
            Message::CancelPartitionRequest { receiver } => conn.cancel(receiver),
            Message::ResumeConsumption { receiver } => conn.on_resume(receiver)?,
            Message::NewBufferSize { receiver, size } => conn.on_new_buffer_size(receiver, size)?,
            Message::CloseRequest => return Ok(()),
            Message::ErrorResponse {
                receiver: None,
                kind,
                message,
            } => return Err(handshake::remote_error(kind, &message)),
            Message::ErrorResponse {
                receiver: Some(receiver),
                ..
            } => conn.cancel(receiver),
            other => {
                return Err(Error::Protocol(format!(
                    "a client sent {:?}, which only servers send",
                    other.message_type()
                )))
            }
        }
    }
}

pub(super) async fn write_loop<W: AsyncWrite + Unpin>(conn: &Arc<ServerConn>, wr: &mut W) -> Result<()> {
    loop {
        let frames = conn.collect()?;
        if frames.is_empty() {
            if conn.closing.load(std::sync::atomic::Ordering::SeqCst) {
                return Ok(());
            }
            conn.wake.notified().await;
            continue;
        }
        let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(frames.len() * 4);
        for f in &frames {
            slices.push(IoSlice::new(&f.head));
            slices.extend(f.parts.iter().map(|p| IoSlice::new(p.bytes())));
        }
        io::write_all_vectored(wr, &mut slices).await?;
        // Dropping the frames recycles their segments and releases handed-off batches.
        drop(slices);
        drop(frames);
        // The reader half shares this task (and the runtime's one I/O thread): let it take
        // the AddCredits and RecordGrants that arrived, or, while the socket has room, this
        // loop would keep writing what it has and read them only once it runs dry.
        tokio::task::yield_now().await;
    }
}
