//! [`HostService`]: one process per host, user and application holding the network stack of
//! every task attached to it: a [`NetworkEnvironment`] (the host's pool, the partitions, the
//! gates, the connections to other hosts) and the listener tasks attach through.
//!
//! Threads: the environment's (flusher, I/O), `creditflow-host` (a tokio runtime: the
//! listener, each session's requests, the links' doorbells), one thread per writer link
//! (`creditflow-host-writer`: writes what the task sends into the partition, blocking while
//! it is full) and per gate link (`creditflow-host-gate`: puts the gate's items on the link),
//! and a blocking thread per request that waits (`wait_consumed`).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::net::{UnixListener, UnixStream};
use tokio::runtime::{Handle, Runtime};
use tokio::sync::{mpsc, watch};

use super::client::CONNECT_TIMEOUT;
use super::codec::{self, put_error, Opening, Request, Welcome};
use super::download;
use super::link::{self, read_body, read_control, read_header, LinkKind};
use super::metrics::ServiceMetrics;
use super::name::{check_name, socket_name};
use super::process::Process;
use super::session::{PendingLink, TaskSession};
use super::state::HostState;
use super::upload;
use crate::base::error::{Error, Result};
use crate::base::wait::Wait;
use crate::env::{EnvConfig, NetworkEnvironment};

/// How long a new connection may take to say what it is.
const OPENING_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the service looks at its owners and its idle time.
const WATCH_PERIOD: Duration = Duration::from_millis(250);

/// Settings of a host service.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// The environment every attached task's partitions and gates live in; its `memory` is
    /// the host's.
    pub env: EnvConfig,
    /// The name tasks find the service by (see [`check_name`]).
    pub name: String,
    /// End after this long with no task attached (`None`: never).
    pub idle_timeout: Option<Duration>,
    /// How long a link a task asked for (a writer's or a gate's) waits to be connected before
    /// the service drops it, and the gate made with it ([`LINK_TIMEOUT`] by default).
    pub link_timeout: Duration,
}

/// The default [`HostConfig::link_timeout`]: twice the time a task spends opening a link
/// before it gives up, so a slow one that succeeds is never cut.
pub const LINK_TIMEOUT: Duration = CONNECT_TIMEOUT.saturating_mul(2);

/// What the runtime's tasks and the worker threads share.
pub(crate) struct Shared {
    pub(crate) host: HostState,
    pub(crate) name: String,
    pub(crate) handle: Handle,
    sessions: Mutex<HashMap<u64, Arc<TaskSession>>>,
    /// The processes it serves for (Spark executors).
    owners: Mutex<Vec<Process>>,
    /// Why the service ended, once it has; waiters are woken.
    ended: (Mutex<Option<String>>, Condvar),
    stop_tx: watch::Sender<bool>,
    idle_timeout: Option<Duration>,
    idle_since: Mutex<Option<Instant>>,
    link_timeout: Duration,
    /// The writers' and gates' links, served on the runtime.
    links: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl Shared {
    /// Ends the service (once): no more attaches, worker threads stop.
    fn end(&self, why: String) {
        let (lock, cv) = &self.ended;
        let mut ended = lock.lock().unwrap();
        if ended.is_none() {
            log::info!("creditflow: host service {:?} ends: {why}", self.name);
            *ended = Some(why);
            self.host.stopping.store(true, Ordering::SeqCst);
            let _ = self.stop_tx.send(true);
            cv.notify_all();
        }
    }

    /// Keeps a link's task, so that the service's end can wait for it.
    fn serve_link(&self, task: tokio::task::JoinHandle<()>) {
        let mut links = self.links.lock().unwrap();
        links.retain(|l| !l.is_finished());
        links.push(task);
    }
}

/// Threads of the service's runtime, which serves the sessions and the links (but a spillable
/// partition's writer link, which has a thread of its own): one per four cores, at least one
/// and at most four. A link wakes a thread of the runtime rather than one of its own, and on a
/// host whose cores are all busy every wake-up of a sleeping thread costs a switch.
fn io_threads() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / 4).clamp(1, 4)
}

/// A host service: serves attached tasks until it ends (its owners are gone, it was idle, or
/// it is closed).
pub struct HostService {
    shared: Arc<Shared>,
    runtime: Mutex<Option<Runtime>>,
}

impl HostService {
    /// Takes the name (an error if a service of this user already has it on this host),
    /// starts the environment and listens.
    pub fn start(config: HostConfig) -> Result<HostService> {
        check_name(&config.name)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(io_threads())
            .thread_name("creditflow-host")
            .enable_all()
            .build()
            .map_err(|e| {
                Error::InvalidArgument(format!("cannot start the host service's I/O thread: {e}"))
            })?;
        let listener = {
            let _guard = runtime.enter();
            UnixListener::bind(socket_name(&config.name)).map_err(|e| {
                if e.kind() == std::io::ErrorKind::AddrInUse {
                    Error::InvalidArgument(format!(
                        "a creditflow host service named {:?} already runs for this user on this host",
                        config.name
                    ))
                } else {
                    Error::InvalidArgument(format!("cannot listen as host service {:?}: {e}", config.name))
                }
            })?
        };
        let env = NetworkEnvironment::new(config.env)?;
        // Opening the spill directory removes those of services (and environments) that were
        // killed and left theirs.
        env.spill_dir()?;
        let (stop_tx, stop_rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            host: HostState::new(env),
            name: config.name,
            handle: runtime.handle().clone(),
            sessions: Mutex::new(HashMap::new()),
            owners: Mutex::new(Vec::new()),
            ended: (Mutex::new(None), Condvar::new()),
            stop_tx,
            idle_timeout: config.idle_timeout,
            link_timeout: config.link_timeout,
            idle_since: Mutex::new(Some(Instant::now())),
            links: Mutex::new(Vec::new()),
        });
        runtime.spawn(accept_loop(listener, Arc::downgrade(&shared), stop_rx));
        runtime.spawn(watch_loop(Arc::downgrade(&shared)));
        Ok(HostService {
            shared,
            runtime: Mutex::new(Some(runtime)),
        })
    }

    /// The environment's address: what peers put in their channel specs.
    pub fn address(&self) -> &str {
        self.shared.host.env.address()
    }

    /// The name tasks find it by.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The environment holding every attached task's partitions and gates.
    pub fn environment(&self) -> &NetworkEnvironment {
        &self.shared.host.env
    }

    /// Its metrics: pool, tasks attached, connections.
    pub fn metrics(&self) -> ServiceMetrics {
        self.shared.host.metrics()
    }

    /// Whether the service has ended (however it ended).
    pub fn has_ended(&self) -> bool {
        self.shared.ended.0.lock().unwrap().is_some()
    }

    /// Blocks until the service ends (its owners are gone, it was idle for `idle_timeout`,
    /// or [`HostService::close`]), as `wait` allows; returns why it ended.
    pub fn wait(&self, wait: &mut Wait<'_>) -> Result<String> {
        let (lock, cv) = &self.shared.ended;
        let mut ended = lock.lock().unwrap();
        loop {
            if let Some(why) = ended.as_ref() {
                return Ok(why.clone());
            }
            let slice = wait.tick()?;
            ended = cv.wait_timeout(ended, slice).unwrap().0;
        }
    }

    /// Ends the service: stops listening (the name is free again), ends every session
    /// (attached tasks raise `ConnectionLost`), releases the partitions and removes the spill
    /// directory. Idempotent.
    pub fn close(&self) {
        self.shared.end("closed".into());
        let Some(runtime) = self.runtime.lock().unwrap().take() else {
            return;
        };
        // The links see the end within a check interval (a writer's after draining what its
        // task sent, at most a second): each fails or closes what it serves and its ring, so
        // its task reads the end of the link rather than a broken one.
        let links: Vec<_> = std::mem::take(&mut *self.shared.links.lock().unwrap());
        if Handle::try_current().is_err() {
            runtime.block_on(async {
                for l in links {
                    let _ = tokio::time::timeout(Duration::from_secs(2), l).await;
                }
            });
        }
        let sessions: Vec<Arc<TaskSession>> = self
            .shared
            .sessions
            .lock()
            .unwrap()
            .drain()
            .map(|(_, s)| s)
            .collect();
        for s in sessions {
            s.end();
        }
        runtime.shutdown_timeout(Duration::from_secs(1));
        self.shared.host.env.close();
    }
}

impl Drop for HostService {
    fn drop(&mut self) {
        self.close();
    }
}

async fn accept_loop(listener: UnixListener, shared: Weak<Shared>, mut stop: watch::Receiver<bool>) {
    let uid = rustix::process::getuid().as_raw();
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.wait_for(|s| *s) => return,
        };
        let Ok((sock, _)) = accepted else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let Some(shared) = shared.upgrade() else { return };
        // Another user's process never gets as far as sending anything.
        let pid = match sock.peer_cred() {
            Ok(c) if c.uid() == uid => c.pid(),
            other => {
                log::warn!("creditflow: host service refused a connection from {other:?}: not this user");
                continue;
            }
        };
        tokio::spawn(connection(sock, pid, shared));
    }
}

/// Writes an error as the answer to a connection's opening.
async fn refuse(sock: &mut UnixStream, e: &Error) {
    log::warn!("creditflow: host service refused a connection: {e}");
    let frame = codec::frame(codec::ty::REFUSED, |o| put_error(o, e));
    let _ = sock.write_all(&frame).await;
}

async fn connection(mut sock: UnixStream, pid: Option<i32>, shared: Arc<Shared>) {
    let opening = async {
        let (len, ty) = read_header(&mut sock, 1024)
            .await?
            .ok_or_else(|| Error::Protocol("a connection that said nothing".into()))?;
        let body = read_body(&mut sock, len - codec::FRAME_HEADER).await?;
        Opening::decode(ty, &body)
    };
    let opening = match tokio::time::timeout(OPENING_TIMEOUT, opening).await {
        Ok(Ok(o)) => o,
        Ok(Err(e)) => return refuse(&mut sock, &e).await,
        Err(_) => return,
    };
    match opening {
        Opening::Attach { pid: said, owner } => {
            if pid != Some(said as i32) {
                let e =
                    Error::Authentication(format!("a task says it is pid {said}, its socket says {pid:?}"));
                return refuse(&mut sock, &e).await;
            }
            session(sock, said, owner, shared).await
        }
        Opening::Link { session, link } => {
            let found = shared.sessions.lock().unwrap().get(&session).cloned();
            let Some(s) = found.filter(|s| Some(s.process.pid() as i32) == pid) else {
                let e = Error::Authentication(format!("no session {session} of pid {pid:?}"));
                return refuse(&mut sock, &e).await;
            };
            let Some(pending) = s.take_link(link) else {
                let e = Error::Protocol(format!("session {session} has no link {link} waiting"));
                return refuse(&mut sock, &e).await;
            };
            let (kind, heap) = match pending {
                PendingLink::Writer { heap, .. } => (LinkKind::Writer, heap),
                PendingLink::Gate(_) => (LinkKind::Gate, link::GATE_HEAP),
            };
            let (end, source) = match link::serve(sock, kind, link, heap).await {
                Ok(x) => x,
                Err(e) => return log::warn!("creditflow: host service could not set up a link: {e}"),
            };
            let (dead, stopping, handle) = (
                s.dead.clone(),
                shared.host.stopping.clone(),
                shared.handle.clone(),
            );
            match pending {
                PendingLink::Writer {
                    partition,
                    partitioner,
                    ..
                } => {
                    let source = source.expect("a writer's link has a heap to hand on");
                    let stop = [dead, stopping];
                    let task = upload::spawn(partition, partitioner, end, source, s.process.pid(), stop);
                    shared.serve_link(task);
                }
                PendingLink::Gate(gate) => {
                    let sent = shared.host.sent.clone();
                    let run = download::run(*gate, end, s.process, sent, [dead, stopping]);
                    shared.serve_link(handle.spawn(async move {
                        run.await;
                        s.gate_ended(link);
                    }));
                }
            }
        }
    }
}

/// A task's session: answers its requests (each on a blocking thread, so that one that
/// waits holds up no other) until it ends, then cleans up after it.
async fn session(sock: UnixStream, pid: u32, owner: u32, shared: Arc<Shared>) {
    let id = shared.host.next_id();
    let s = Arc::new(TaskSession::new(pid));
    shared.sessions.lock().unwrap().insert(id, s.clone());
    shared.host.attached.fetch_add(1, Ordering::SeqCst);
    *shared.idle_since.lock().unwrap() = None;
    if owner != 0 {
        let mut owners = shared.owners.lock().unwrap();
        if !owners.iter().any(|o| o.pid() == owner) {
            owners.push(Process::of(owner));
        }
    }
    log::debug!("creditflow: host service: task pid {pid} attached (session {id})");
    let welcome = Welcome {
        session: id,
        pid: std::process::id(),
        address: shared.host.env.address().to_string(),
        memory: shared.host.env.config().memory as u64,
        segment_size: shared.host.env.config().segment_size as u64,
    };
    let (mut rd, mut wr) = sock.into_split();
    let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let _ = tx.send(welcome.encode());
    let writer = tokio::spawn(async move {
        while let Some(frame) = rx.recv().await {
            if wr.write_all(&frame).await.is_err() {
                return;
            }
        }
    });
    let mut stop = shared.stop_tx.subscribe();
    loop {
        let frame = async {
            let (ty, body) = read_control(&mut rd, || "the task closed its session".into()).await?;
            if ty != codec::ty::REQUEST {
                return Err(Error::Protocol(format!("frame type {ty} on a session")));
            }
            Request::decode(&body)
        };
        let (rid, request) = tokio::select! {
            f = frame => match f {
                Ok(r) => r,
                Err(e) => {
                    log::debug!("creditflow: host service: session {id} (pid {pid}) ends: {e}");
                    break;
                }
            },
            _ = stop.wait_for(|s| *s) => break,
        };
        let (s, shared, tx) = (s.clone(), shared.clone(), tx.clone());
        tokio::task::spawn_blocking(move || {
            let reply = s.handle(&shared.host, request);
            let _ = tx.send(reply.encode(rid));
        });
    }
    s.end();
    if shared.sessions.lock().unwrap().remove(&id).is_some() {
        shared.host.attached.fetch_sub(1, Ordering::SeqCst);
    }
    drop(tx);
    writer.abort();
}

/// Ends the service when every owner it served for is gone, or after `idle_timeout` with no
/// task attached; drops the links tasks asked for and did not connect within `link_timeout`.
async fn watch_loop(shared: Weak<Shared>) {
    loop {
        tokio::time::sleep(WATCH_PERIOD).await;
        let Some(shared) = shared.upgrade() else { return };
        if shared.host.stopping.load(Ordering::SeqCst) {
            return;
        }
        let owners = shared.owners.lock().unwrap().clone();
        if !owners.is_empty() && owners.iter().all(|o| !o.alive()) {
            let pids: Vec<u32> = owners.iter().map(|o| o.pid()).collect();
            shared.end(format!("the processes it served ({pids:?}) ended"));
            return;
        }
        let sessions: Vec<Arc<TaskSession>> = shared.sessions.lock().unwrap().values().cloned().collect();
        for s in &sessions {
            s.drop_stale_links(shared.link_timeout);
        }
        let idle = sessions.is_empty();
        let mut since = shared.idle_since.lock().unwrap();
        if !idle {
            *since = None;
            continue;
        }
        let since = *since.get_or_insert_with(Instant::now);
        if let Some(limit) = shared.idle_timeout {
            if since.elapsed() >= limit {
                shared.end(format!("no task attached for {limit:?}"));
                return;
            }
        }
    }
}
