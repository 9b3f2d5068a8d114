//! The task's side of a session: the connection to its service and the control requests
//! answered by id over it, shared by the objects made through it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;
use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot};

use super::codec::{Opening, Reply, Request, Welcome};
use super::link::{self, LinkEnd, LinkKind};
use super::metrics;
use super::name::socket_name;
use super::runtime::block_on;
use crate::base::error::{Error, Result};
use crate::base::wait::Wait;
use crate::gate::GateMetrics;
use crate::net::shm::check_peer;

/// How long connecting to the service and setting a link up may take.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Requests waiting for their answer, and why the session ended once it has.
#[derive(Default)]
pub(crate) struct Pending {
    pub(crate) replies: HashMap<u64, oneshot::Sender<Reply>>,
    pub(crate) ended: Option<String>,
}

/// One task's session with its host service, shared by the objects made through it.
pub(crate) struct Session {
    pub(crate) name: String,
    pub(crate) handle: Handle,
    pub(crate) welcome: Welcome,
    pub(crate) out: mpsc::UnboundedSender<Vec<u8>>,
    pub(crate) pending: Arc<Mutex<Pending>>,
    pub(crate) next_id: AtomicU64,
    pub(crate) io: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Session {
    fn drop(&mut self) {
        // Ends the connection: the service then cleans up after this task.
        for t in &self.io {
            t.abort();
        }
    }
}

impl Session {
    /// The error every call raises once the service is gone.
    pub(crate) fn lost(&self, why: &str) -> Error {
        Error::ConnectionLost(format!(
            "the creditflow host service {:?} (pid {}) is gone: {why}",
            self.name, self.welcome.pid
        ))
    }

    /// Why the session ended, if it has.
    pub(crate) fn ended(&self) -> Option<String> {
        self.pending.lock().unwrap().ended.clone()
    }

    /// Sends `request` and waits for its answer as `wait` allows; a failure the service
    /// reports is returned as the error it was.
    pub(crate) fn request(&self, request: Request, wait: &mut Wait<'_>) -> Result<Reply> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut p = self.pending.lock().unwrap();
            if let Some(why) = &p.ended {
                return Err(self.lost(why));
            }
            p.replies.insert(id, tx);
        }
        if self.out.send(request.encode(id)).is_err() {
            self.pending.lock().unwrap().replies.remove(&id);
            return Err(self.lost(&self.ended().unwrap_or_default()));
        }
        match block_on(&self.handle, rx, wait) {
            Err(e) => {
                self.pending.lock().unwrap().replies.remove(&id);
                Err(e)
            }
            Ok(Err(_)) => Err(self.lost(&self.ended().unwrap_or_default())),
            Ok(Ok(Reply::Failed(e))) => Err(e),
            Ok(Ok(reply)) => Ok(reply),
        }
    }

    /// A request that needs no waiting beyond the answer (bounded, and interruptible only by
    /// the service's end).
    pub(crate) fn ask(&self, request: Request) -> Result<Reply> {
        self.request(
            request,
            &mut Wait::timeout(Some(CONNECT_TIMEOUT * 6), "host service"),
        )
    }

    /// Connects the link `link` the service set up for this session.
    pub(crate) fn open_link(&self, link: u64, kind: LinkKind) -> Result<LinkEnd> {
        block_on(&self.handle, self.link_opening(link, kind), &mut link_wait())?
    }

    /// What [`Session::open_link`] runs, for a runtime of the caller's choice (the link's
    /// sockets belong to the runtime that runs it).
    pub(crate) fn link_opening(
        &self,
        link: u64,
        kind: LinkKind,
    ) -> impl std::future::Future<Output = Result<LinkEnd>> + Send + 'static {
        let name = socket_name(&self.name);
        let (session, pid) = (self.welcome.session, self.welcome.pid);
        async move {
            let mut sock = UnixStream::connect(&name).await.map_err(link::lost)?;
            check_peer(&sock, pid).map_err(|e| Error::Authentication(e.to_string()))?;
            sock.write_all(&Opening::Link { session, link }.encode())
                .await
                .map_err(link::lost)?;
            link::open(sock, kind).await
        }
    }
}

/// How long setting a link up may take.
pub(crate) fn link_wait() -> Wait<'static> {
    Wait::timeout(Some(CONNECT_TIMEOUT), "host service")
}

/// A gate's metrics from the service.
pub(crate) fn gate_metrics(session: &Session, link: u64) -> Result<GateMetrics> {
    match session.ask(Request::GateMetrics { link })? {
        Reply::Metrics(bytes) => metrics::decode_gate(&bytes),
        other => Err(Error::Protocol(format!("attach: {other:?} instead of metrics"))),
    }
}
