//! The TCP side of an environment: the runtime, the listener, the connections.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::watch;

use super::client::{ClientConn, ClientContext, RemoteChannel, RemoteGate};
use super::limits::{self, Slots};
use super::server::{self, ServerConn};
use super::shm::{self, ShmListener};
use super::tls::{self, Tls, TLS_HANDSHAKE_RECORD};
use crate::base::config::{Backoff, ChannelSpec, FlowControl, Limits};
use crate::base::error::{Error, Result};
use crate::partition::subpartition::Listener;
use crate::partition::Registry;
use crate::protocol::wire;
use crate::serde::Compression;

/// What the transport needs from its environment.
#[derive(Clone)]
pub(crate) struct TransportConfig {
    pub(crate) segment_size: usize,
    pub(crate) secret: Option<Vec<u8>>,
    pub(crate) flow_control: FlowControl,
    pub(crate) backoff: Backoff,
    /// How long a peer may take to connect and complete the handshake.
    pub(crate) handshake_timeout: Duration,
    /// Limits on what peers may ask of this environment.
    pub(crate) limits: Limits,
    /// TLS on every connection, both ways; `None`: plaintext.
    pub(crate) tls: Option<Arc<Tls>>,
    /// A connection whose peer acknowledges nothing for this long fails (zero: OS defaults).
    pub(crate) peer_timeout: Duration,
    /// IPC body compression of the batches encoded for remote readers (handed-off ones).
    pub(crate) wire_compression: Option<Compression>,
    /// Offer shared-memory links to peers on this host (as server and as client).
    pub(crate) shared_memory: bool,
    /// The environment's `memory`, which sizes the heap of the links it serves.
    pub(crate) memory: usize,
}

/// The TCP side of one environment: a tokio runtime (created with the environment, never at
/// import), the listener's accept loop, and the client connections to other environments,
/// one per remote address, shared by all gates.
pub(crate) struct Transport {
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
    handle: tokio::runtime::Handle,
    config: TransportConfig,
    clients: Mutex<HashMap<String, Arc<ClientConn>>>,
    next_receiver: AtomicU64,
    /// Set to true to end the accept loop and every served connection (gracefully).
    shutdown: watch::Sender<bool>,
    /// The accept loop; it ends after its connections have finished.
    accept: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Connections this environment serves (to wait for them to drain).
    served: Arc<Mutex<Vec<Weak<ServerConn>>>>,
}

impl Transport {
    /// Starts the I/O thread and serves `listener`.
    pub(crate) fn start(
        listener: std::net::TcpListener,
        config: TransportConfig,
        registry: Weak<Registry>,
    ) -> Result<Transport> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("creditflow-io")
            .enable_all()
            .build()
            .map_err(|e| Error::InvalidArgument(format!("cannot start the I/O thread: {e}")))?;
        let handle = runtime.handle().clone();
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::InvalidArgument(format!("listener: {e}")))?;
        let listener = {
            let _guard = runtime.enter();
            tokio::net::TcpListener::from_std(listener)
                .map_err(|e| Error::InvalidArgument(format!("listener: {e}")))?
        };
        let (shutdown, shutdown_rx) = watch::channel(false);
        let shm = if config.shared_memory {
            match ShmListener::start(&handle, shutdown_rx.clone(), shm::heap_bytes_for(config.memory)) {
                Ok(l) => Some(l),
                Err(e) => {
                    log::info!("creditflow: no shared-memory channels: {e}");
                    None
                }
            }
        } else {
            None
        };
        let served = Arc::new(Mutex::new(Vec::new()));
        let ctx = AcceptContext {
            segment_size: config.segment_size,
            secret: config.secret.clone(),
            handshake_timeout: config.handshake_timeout,
            limits: config.limits,
            tls: config.tls.clone(),
            peer_timeout: config.peer_timeout,
            wire_compression: config.wire_compression,
            registry,
            shutdown: shutdown_rx,
            served: served.clone(),
            shm,
        };
        let accept = handle.spawn(accept_loop(listener, ctx));
        Ok(Transport {
            runtime: Mutex::new(Some(runtime)),
            handle,
            config,
            clients: Mutex::new(HashMap::new()),
            next_receiver: AtomicU64::new(1),
            shutdown,
            accept: Mutex::new(Some(accept)),
            served,
        })
    }

    /// Opens a remote channel reading `spec` into `gate`; `notify` is called whenever the
    /// channel has something new.
    pub(crate) fn open_channel(
        &self,
        spec: ChannelSpec,
        gate: &Arc<RemoteGate>,
        notify: Listener,
    ) -> Arc<RemoteChannel> {
        let conn = {
            let mut clients = self.clients.lock().unwrap();
            match clients.get(&spec.address) {
                Some(c) if !c.is_dead() => c.clone(),
                _ => {
                    let ctx = ClientContext {
                        segment_size: self.config.segment_size,
                        secret: self.config.secret.clone(),
                        handshake_timeout: self.config.handshake_timeout,
                        tls: self.config.tls.clone(),
                        peer_timeout: self.config.peer_timeout,
                        shm: self.config.shared_memory,
                    };
                    let c = ClientConn::open(spec.address.clone(), ctx, &self.handle);
                    clients.insert(spec.address.clone(), c.clone());
                    c
                }
            }
        };
        let rid = wire::ReceiverId(self.next_receiver.fetch_add(1, Ordering::Relaxed));
        conn.open_channel(rid, spec, gate, notify, self.config.backoff)
    }

    /// Connections this environment opened that are up (one per remote address its gates
    /// read from), and connections it serves now.
    pub(crate) fn connection_counts(&self) -> (usize, usize) {
        let opened = self
            .clients
            .lock()
            .unwrap()
            .values()
            .filter(|c| !c.is_dead())
            .count();
        let served = self
            .served
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.strong_count() > 0)
            .count();
        (opened, served)
    }

    /// Flow control of this environment's gates.
    pub(crate) fn flow_control(&self) -> FlowControl {
        self.config.flow_control
    }

    /// Waits until no served connection still has a reader of a *finished* partition (one
    /// whose writer sent end-of-partition) that has not been sent everything, or `deadline`.
    /// So a producer that closes its environment right after its writers does not cut off
    /// what its remote consumers have yet to receive. Returns whether everything drained.
    pub(crate) fn drain(&self, deadline: std::time::Instant) -> bool {
        loop {
            let busy = self
                .served
                .lock()
                .unwrap()
                .iter()
                .filter_map(Weak::upgrade)
                .any(|c| c.has_undrained_readers());
            if !busy {
                return true;
            }
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Closes every connection and stops the I/O thread (waiting up to a second for
    /// CloseRequests to go out). Idempotent.
    pub(crate) fn close(&self) {
        let clients: Vec<Arc<ClientConn>> = self.clients.lock().unwrap().drain().map(|(_, c)| c).collect();
        for c in &clients {
            c.close();
        }
        let _ = self.shutdown.send(true);
        if let Some(accept) = self.accept.lock().unwrap().take() {
            // Served connections finish their last write and close their side first.
            let _ = self
                .handle
                .block_on(async move { tokio::time::timeout(CLOSE_GRACE, accept).await });
        }
        if let Some(rt) = self.runtime.lock().unwrap().take() {
            if !clients.is_empty() {
                // Let the writers send their CloseRequest.
                std::thread::sleep(Duration::from_millis(20));
            }
            rt.shutdown_timeout(Duration::from_secs(1));
        }
    }
}

impl Drop for Transport {
    fn drop(&mut self) {
        self.close();
    }
}

/// How long closing waits for served connections to finish their last write.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

struct AcceptContext {
    segment_size: usize,
    secret: Option<Vec<u8>>,
    handshake_timeout: Duration,
    limits: Limits,
    tls: Option<Arc<Tls>>,
    peer_timeout: Duration,
    wire_compression: Option<Compression>,
    registry: Weak<Registry>,
    shutdown: watch::Receiver<bool>,
    served: Arc<Mutex<Vec<Weak<ServerConn>>>>,
    shm: Option<Arc<ShmListener>>,
}

async fn accept_loop(listener: tokio::net::TcpListener, ctx: AcceptContext) {
    let AcceptContext {
        segment_size,
        secret,
        handshake_timeout,
        limits,
        tls,
        peer_timeout,
        wire_compression,
        registry,
        mut shutdown,
        served,
        shm,
    } = ctx;
    let mut connections = tokio::task::JoinSet::new();
    let slots = Slots::default();
    let refusals = Slots::default();
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.wait_for(|closing| *closing) => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        match accepted {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                super::liveness::set_peer_timeout(&stream, peer_timeout);
                let Some(slot) = slots.try_take(limits.max_connections) else {
                    log::warn!(
                        "creditflow: refused connection from {peer}: {} connections served (max_connections)",
                        limits.max_connections
                    );
                    if let Some(refusal) = refusals.try_take(limits::MAX_REFUSALS) {
                        let error = limits.connections_error();
                        connections.spawn(async move {
                            limits::refuse(stream, &error).await;
                            drop(refusal);
                        });
                    }
                    continue;
                };
                let sctx = server::ServeContext {
                    segment_size,
                    secret: secret.clone(),
                    handshake_timeout,
                    limits,
                    slot,
                    wire_compression,
                    registry: registry.clone(),
                    shutdown: shutdown.clone(),
                    served: served.clone(),
                    shm: shm.clone(),
                };
                connections.spawn(connection(stream, peer.to_string(), tls.clone(), sctx));
            }
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                log::warn!("creditflow: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
}

/// A new connection: TLS or plaintext as this environment is configured, refusing a peer
/// that speaks the other (see [`super::tls`]); then served. The handshake timeout covers the
/// first byte, the TLS handshake and the creditflow handshake together.
async fn connection(
    stream: tokio::net::TcpStream,
    peer: String,
    tls: Option<Arc<Tls>>,
    mut ctx: server::ServeContext,
) {
    let deadline = tokio::time::Instant::now() + ctx.handshake_timeout;
    let silent = || {
        log::warn!(
            "creditflow: dropped connection from {peer}: no handshake within {:?}",
            ctx.handshake_timeout
        )
    };
    let first = match tokio::time::timeout_at(deadline, tls::first_byte(&stream)).await {
        Ok(Some(b)) => b,
        Ok(None) => return,
        Err(_) => return silent(),
    };
    match (tls, first == TLS_HANDSHAKE_RECORD) {
        (None, false) => {
            let (rd, wr) = stream.into_split();
            server::serve(rd, wr, peer, ctx).await
        }
        (Some(tls), true) => match tokio::time::timeout_at(deadline, tls.accept(stream)).await {
            Ok(Ok((rd, wr))) => {
                ctx.handshake_timeout = deadline.saturating_duration_since(tokio::time::Instant::now());
                server::serve(rd, wr, peer, ctx).await
            }
            Ok(Err(e)) => log::warn!("creditflow: refused connection from {peer}: {e}"),
            Err(_) => silent(),
        },
        (Some(_), false) => {
            let e = Error::Authentication(
                "this environment requires TLS and the peer connected without it; \
                 give every environment tls=TLSConfig(...)"
                    .into(),
            );
            log::warn!("creditflow: refused connection from {peer}: {e}");
            limits::refuse(stream, &e).await;
        }
        (None, true) => {
            // The answer is not TLS, which the peer's TLS client reports; it is here so the
            // peer reads it instead of a reset.
            let e = Error::Authentication(
                "the peer speaks TLS but this environment has no tls configured; \
                 give every environment tls=TLSConfig(...)"
                    .into(),
            );
            log::warn!("creditflow: refused connection from {peer}: {e}");
            limits::refuse(stream, &e).await;
        }
    }
}
