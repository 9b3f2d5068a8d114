//! The service's side of a writer's link (a `creditflow-host-writer` thread): decodes the
//! pieces the task sends and queues each in its subpartition, blocking while the partition is
//! full, which is what holds the task's writer back. A piece that lies in the link's heap is
//! queued with its place ([`InHeap`]), so that a gate of this host can hand it on as it lies.
//! A link that ends without the writer's close (the task died, or dropped the writer) fails
//! the partition.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::runtime::Handle;

use super::codec::Signal;
use super::link::{self, HeapEnd, InHeap, LinkEnd, SourceHeap, Watched};
use super::records::{read_incoming, small, Incoming};
use super::runtime::block_on;
use crate::base::error::{Error, Result};
use crate::base::wait::Wait;
use crate::memory::RecordPool;
use crate::partition::subpartition::Token;
use crate::partition::{Partitioner, RecordWriter, ResultPartition};
use crate::serde::SelfContainedDecoder;

/// The most bytes one record may have.
const MAX_RECORD: usize = 2 << 30;
/// Idle record blocks kept for the next records, at most.
const RECORD_POOL: usize = 16 << 20;
/// How long the frames a task sent before it went are still read.
const DRAIN: Duration = Duration::from_secs(1);

/// Runs a writer's link until the writer closes or fails, or the task or the service goes.
/// `stop`: flags that end it (the session's end, the service's).
pub(crate) fn run(
    partition: Arc<ResultPartition>,
    partitioner: Partitioner,
    end: LinkEnd,
    source: SourceHeap,
    handle: Handle,
    pid: u32,
    stop: [Arc<AtomicBool>; 2],
) {
    let mut link = Watched::new(end, &handle, stop);
    let HeapEnd::Reader(heap) = &link.heap else {
        log::warn!("creditflow: host service: a writer's link with the wrong heap side");
        return;
    };
    let heap = heap.clone();
    let stops = link.stops();
    // Once the task dropped the link or went, what it sent before is still read from the ring
    // (and written) for DRAIN; only then does the link end for it.
    let mut stopped: Option<Instant> = None;
    let mut check = || {
        if stops.iter().any(|f| f.load(Ordering::SeqCst))
            && stopped.get_or_insert_with(Instant::now).elapsed() >= DRAIN
        {
            Err(Error::ConnectionLost(format!("the task (pid {pid}) went away")))
        } else {
            Ok(())
        }
    };
    let mut wait = Wait::forever().with_check(&mut check);
    let pool = RecordPool::new(RECORD_POOL);
    let source = Arc::new(source);
    // The reading task checks the strings when it decodes a piece: the service passes them on.
    let mut pieces = SelfContainedDecoder::relay(MAX_RECORD);
    let mut w = RecordWriter::new(partition.clone(), partitioner);
    let mut reply = |signal: Signal, wait: &mut Wait<'_>| -> Result<()> {
        let frame = small(signal.encode());
        block_on(&handle, link::write_all(&mut link.writer, &frame), wait)?.map_err(link::lost)
    };
    let outcome: Result<()> = loop {
        let incoming = match block_on(
            &handle,
            read_incoming(&mut link.reader, Some(&heap), &pool, MAX_RECORD),
            &mut wait,
        ) {
            Ok(Ok(Some(x))) => x,
            Ok(Ok(None)) => {
                break Err(Error::ConnectionLost(format!(
                    "the task (pid {pid}) closed the writer's link without closing the writer"
                )))
            }
            Ok(Err(e)) | Err(e) => break Err(e),
        };
        let step = match incoming {
            Incoming::Piece { head, body, lease } => pieces.decode(body).and_then(|batch| {
                let token = lease.map(|lease| {
                    let source = source.clone();
                    Arc::new(InHeap { source, lease }) as Token
                });
                w.write_to(&batch, token, head.channel as usize, &mut wait)
            }),
            Incoming::Signal(Signal::Event {
                target: None,
                payload,
            }) => w.broadcast_event(&payload),
            Incoming::Signal(Signal::Event {
                target: Some(t),
                payload,
            }) => w.emit_event(&payload, t as usize),
            Incoming::Signal(Signal::Barrier { id, unaligned }) => {
                w.broadcast_barrier(id, unaligned).and_then(|o| {
                    let overtaken = o.into_iter().map(|n| n as u64).collect();
                    reply(Signal::Ack { overtaken }, &mut wait)
                })
            }
            Incoming::Signal(Signal::Flush) => {
                w.flush();
                Ok(())
            }
            Incoming::Signal(Signal::Close) => {
                break w.close().and_then(|()| {
                    reply(
                        Signal::Ack {
                            overtaken: Vec::new(),
                        },
                        &mut wait,
                    )
                });
            }
            Incoming::Signal(Signal::Fail { message }) => {
                partition.fail(&message);
                break reply(
                    Signal::Ack {
                        overtaken: Vec::new(),
                    },
                    &mut wait,
                );
            }
            Incoming::Signal(other) => Err(Error::Protocol(format!("attach: {other:?} on a writer's link"))),
            Incoming::Record { .. } | Incoming::Forward { .. } => Err(Error::Protocol(
                "attach: a record other than a piece on a writer's link".into(),
            )),
        };
        if let Err(e) = step {
            break Err(e);
        }
    };
    if let Err(e) = outcome {
        // Nothing partial is taken for complete: the readers get what was written, then this.
        partition.fail(&format!(
            "the writer of partition {:?} in task pid {pid} failed: {e}",
            partition.id()
        ));
        let mut brief = Wait::timeout(Some(std::time::Duration::from_millis(500)), "host service");
        let _ = reply(Signal::Error(e), &mut brief);
    }
    // Closes the ring: the task reads what is in it, then the end.
    let _ = handle.block_on(async {
        use tokio::io::AsyncWriteExt;
        link.writer.shutdown().await
    });
}
