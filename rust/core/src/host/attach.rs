//! What a task attaches with: [`Attachment`] (its session with the host service) and
//! [`AttachedPartition`] (a partition the service holds).

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use arrow_schema::SchemaRef;
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;
use tokio::sync::mpsc;

use super::client::{Pending, Session, CONNECT_TIMEOUT};
use super::codec::{self, get_error, In, Opening, Reply, Request, Welcome};
use super::gate::AttachedGate;
use super::link::{self, read_control, LinkKind};
use super::metrics::{self, ServiceMetrics};
use super::name::{check_name, socket_name};
use super::runtime::{self, block_on};
use super::writer::AttachedWriter;
use crate::base::config::ChannelSpec;
use crate::base::error::{Error, Result};
use crate::base::wait::Wait;
use crate::partition::spill::SpillKind;
use crate::partition::{PartitionMetrics, Partitioner};
use crate::serde::Compression;

/// A task's attachment to its host's service: creates partitions and gates that live in the
/// service. Cheap to clone; the session ends when the last clone and every object made
/// through it are dropped (or the process ends).
#[derive(Clone)]
pub struct Attachment {
    session: Arc<Session>,
    /// Bytes of each writer link's heap: follows the task's own `memory`.
    writer_heap: usize,
}

/// Connects to the service's socket `sock_name`, checks that it runs as this user (its peer
/// credentials) and is the process it says it is, and says who attaches (`owner`: the process
/// whose end ends the service).
async fn handshake(sock_name: String, service: String, owner: u32) -> Result<(UnixStream, Welcome)> {
    let no_service = |e: std::io::Error| {
        Error::ConnectionLost(format!(
            "no creditflow host service {service:?} answers on this host: {e}"
        ))
    };
    let mut sock = UnixStream::connect(&sock_name).await.map_err(no_service)?;
    let uid = rustix::process::getuid().as_raw();
    let cred = sock.peer_cred().map_err(link::lost)?;
    if cred.uid() != uid {
        return Err(Error::Authentication(format!(
            "the host service {service:?} runs as uid {}, this process as {uid}",
            cred.uid()
        )));
    }
    let pid = std::process::id();
    sock.write_all(&Opening::Attach { pid, owner }.encode())
        .await
        .map_err(link::lost)?;
    let (ty, body) = read_control(&mut sock, || {
        format!("the host service {service:?} closed at once")
    })
    .await?;
    let welcome = match ty {
        codec::ty::WELCOME => Welcome::decode(&body)?,
        codec::ty::REFUSED => return Err(get_error(&mut In::new(&body))?),
        t => {
            return Err(Error::Protocol(format!(
                "attach: frame type {t} instead of a welcome"
            )))
        }
    };
    if cred.pid() != Some(welcome.pid as i32) {
        return Err(Error::Authentication(format!(
            "the host service says it is pid {}, its socket says {:?}",
            welcome.pid,
            cred.pid()
        )));
    }
    Ok((sock, welcome))
}

/// The session's two tasks on `sock`: one writes the requests queued on `requests`, one
/// hands each reply to the request waiting for it. Either ending ends the session: `pending`
/// notes why, and its waiting requests wake.
fn session_io(
    handle: &tokio::runtime::Handle,
    sock: UnixStream,
    mut requests: mpsc::UnboundedReceiver<Vec<u8>>,
    pending: &Arc<Mutex<Pending>>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let (mut rd, mut wr) = sock.into_split();
    let end = |pending: &Mutex<Pending>, why: String| {
        let mut p = pending.lock().unwrap();
        p.ended.get_or_insert(why);
        // Dropping the senders wakes every waiting request.
        p.replies.clear();
    };
    let writer = {
        let pending = pending.clone();
        handle.spawn(async move {
            while let Some(frame) = requests.recv().await {
                if let Err(e) = wr.write_all(&frame).await {
                    end(&pending, format!("writing to it failed: {e}"));
                    return;
                }
            }
        })
    };
    let reader = {
        let pending = pending.clone();
        handle.spawn(async move {
            let why = loop {
                let frame = async {
                    let (ty, body) = read_control(&mut rd, || "it closed the session".into()).await?;
                    if ty != codec::ty::REPLY {
                        return Err(Error::Protocol(format!("frame type {ty} on a session")));
                    }
                    Reply::decode(&body)
                };
                match frame.await {
                    Ok((id, reply)) => {
                        if let Some(tx) = pending.lock().unwrap().replies.remove(&id) {
                            let _ = tx.send(reply);
                        }
                    }
                    Err(e) => break e.to_string(),
                }
            };
            end(&pending, why);
        })
    };
    vec![writer, reader]
}

impl Attachment {
    /// Attaches to the service `name` of this user on this host; `owner` is the pid of the
    /// process this task belongs to (a Spark executor; 0: none), whose end may end the
    /// service. `memory` is the task's own (bytes), as an environment's: each of its writers
    /// places batches in a heap of that much (at least 1 MiB, at most 1 GiB), whose pages count
    /// in the task's memory once written. [`Error::ConnectionLost`] when no service answers at
    /// that name.
    pub fn connect(name: &str, owner: u32, memory: usize) -> Result<Attachment> {
        check_name(name)?;
        let handle = runtime::handle()?;
        let fut = handshake(socket_name(name), name.to_string(), owner);
        let mut wait = Wait::timeout(Some(CONNECT_TIMEOUT), "host service");
        let (sock, welcome) = block_on(&handle, fut, &mut wait)??;
        let (out, rx) = mpsc::unbounded_channel::<Vec<u8>>();
        let pending = Arc::new(Mutex::new(Pending::default()));
        let io = session_io(&handle, sock, rx, &pending);
        Ok(Attachment {
            session: Arc::new(Session {
                name: name.to_string(),
                handle,
                welcome,
                out,
                pending,
                next_id: AtomicU64::new(1),
                io,
            }),
            writer_heap: link::writer_heap(memory),
        })
    }

    /// The service's address: what peers put in their channel specs to read partitions
    /// created here.
    pub fn address(&self) -> &str {
        &self.session.welcome.address
    }

    /// The service's name.
    pub fn name(&self) -> &str {
        &self.session.name
    }

    /// The service's pid.
    pub fn service_pid(&self) -> u32 {
        self.session.welcome.pid
    }

    /// The host's `memory` (bytes) and `segment_size`.
    pub fn memory(&self) -> (u64, u64) {
        (self.session.welcome.memory, self.session.welcome.segment_size)
    }

    /// Bytes of the heap each writer of this task places batches in.
    pub fn writer_heap(&self) -> usize {
        self.writer_heap
    }

    /// Why the session ended (the service is gone), if it has.
    pub fn ended(&self) -> Option<String> {
        self.session.ended()
    }

    /// Creates a partition held by the service: pipelined (`kind` `None`), blocking or
    /// hybrid, as [`crate::NetworkEnvironment::create_partition`] and
    /// [`crate::NetworkEnvironment::create_spillable_partition`] do there.
    pub fn create_partition(
        &self,
        id: &str,
        subpartitions: usize,
        kind: Option<SpillKind>,
        compression: Option<Compression>,
    ) -> Result<AttachedPartition> {
        let n = u32::try_from(subpartitions)
            .map_err(|_| Error::InvalidArgument(format!("{subpartitions} subpartitions is too many")))?;
        self.session.ask(Request::CreatePartition {
            id: id.to_string(),
            subpartitions: n,
            kind,
            compression,
        })?;
        Ok(AttachedPartition {
            session: self.session.clone(),
            id: id.to_string(),
            subpartitions,
            schema: Arc::new(Mutex::new(None)),
            writer_heap: self.writer_heap,
        })
    }

    /// Creates a gate in the service over `specs` (a channel whose address is the service's
    /// own reads there, in place; any other over the service's connection to that address)
    /// and the link that brings its items here.
    pub fn create_input_gate(&self, specs: Vec<ChannelSpec>) -> Result<AttachedGate> {
        let reply = self.session.ask(Request::CreateGate { specs: specs.clone() })?;
        let Reply::Link { link } = reply else {
            return Err(Error::Protocol(format!(
                "attach: {reply:?} instead of a gate's link"
            )));
        };
        AttachedGate::open(self.session.clone(), link, specs)
    }

    /// Asks the service `request` as it is (for tests that send what this API would not).
    #[cfg(test)]
    pub(crate) fn ask(&self, request: Request) -> Result<Reply> {
        self.session.ask(request)
    }

    /// The service's metrics: its pool and connections.
    pub fn service_metrics(&self) -> Result<ServiceMetrics> {
        match self.session.ask(Request::ServiceMetrics)? {
            Reply::Metrics(bytes) => metrics::decode_service(&bytes),
            other => Err(Error::Protocol(format!("attach: {other:?} instead of metrics"))),
        }
    }
}

/// A partition held by the host service, created by this task. Writers write it through the
/// service; it outlives the task once finished.
pub struct AttachedPartition {
    session: Arc<Session>,
    id: String,
    subpartitions: usize,
    /// The schema of the first batch a writer of this task wrote.
    schema: Arc<Mutex<Option<SchemaRef>>>,
    /// Bytes of each writer link's heap.
    writer_heap: usize,
}

impl AttachedPartition {
    /// The partition id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Number of subpartitions.
    pub fn num_subpartitions(&self) -> usize {
        self.subpartitions
    }

    /// The schema of the first batch written through this task, if any.
    pub fn schema(&self) -> Option<SchemaRef> {
        self.schema.lock().unwrap().clone()
    }

    /// A writer through `partitioner`, on a link of its own.
    pub fn writer(&self, partitioner: Partitioner) -> Result<AttachedWriter> {
        let reply = self.session.ask(Request::OpenWriter {
            partition: self.id.clone(),
            partitioner: partitioner.clone(),
            heap: self.writer_heap as u64,
        })?;
        let Reply::Link { link } = reply else {
            return Err(Error::Protocol(format!(
                "attach: {reply:?} instead of a writer's link"
            )));
        };
        let end = self.session.open_link(link, LinkKind::Writer)?;
        AttachedWriter::start(
            self.session.clone(),
            self.id.clone(),
            partitioner,
            self.subpartitions,
            self.schema.clone(),
            end,
        )
    }

    fn state(&self) -> Result<(bool, bool)> {
        match self.session.ask(Request::PartitionState {
            partition: self.id.clone(),
        })? {
            Reply::State { finished, released } => Ok((finished, released)),
            other => Err(Error::Protocol(format!("attach: {other:?} instead of a state"))),
        }
    }

    /// Whether end-of-partition (or a failure) was sent.
    pub fn is_finished(&self) -> Result<bool> {
        self.state().map(|s| s.0)
    }

    /// Whether the partition was released.
    pub fn is_released(&self) -> Result<bool> {
        self.state().map(|s| s.1)
    }

    /// Makes partly filled buffers readable now.
    pub fn flush(&self) -> Result<()> {
        self.session.ask(Request::Flush {
            partition: self.id.clone(),
        })?;
        Ok(())
    }

    /// Drops the partition's data and memory in the service.
    pub fn release(&self) -> Result<()> {
        self.session.ask(Request::Release {
            partition: self.id.clone(),
        })?;
        Ok(())
    }

    /// Blocks until every reader received everything (see
    /// [`crate::ResultPartition::wait_consumed`]).
    pub fn wait_consumed(&self, wait: &mut Wait<'_>) -> Result<()> {
        let request = Request::WaitConsumed {
            partition: self.id.clone(),
            timeout: wait.remaining(),
        };
        self.session.request(request, wait)?;
        Ok(())
    }

    /// The partition's metrics, as the service sees them.
    pub fn metrics(&self) -> Result<PartitionMetrics> {
        match self.session.ask(Request::PartitionMetrics {
            partition: self.id.clone(),
        })? {
            Reply::Metrics(bytes) => metrics::decode_partition(&bytes),
            other => Err(Error::Protocol(format!("attach: {other:?} instead of metrics"))),
        }
    }
}
