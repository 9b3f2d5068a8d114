//! The host service: one process per host, user and application that holds the network stack
//! of every task attached to it, as Flink's TaskManager holds its tasks': one pool for the
//! host, the partitions (which outlive the task that wrote them once finished), the gates, and
//! one connection per pair of hosts. A task attaches through shared memory and keeps thin
//! handles with the API of the environment's own (`docs/design.md`, "The host service").
//!
//! Rooms, the service's side first: `name` (the abstract socket tasks find a service by),
//! `codec` (the attach protocol's messages, no I/O), `metrics` (snapshots across a session),
//! `link` (a task's link: the region, its rings and heap, the doorbell), `records` (batches
//! over a link), `runtime` (the attached process's I/O thread and blocking waits), `service`
//! ([`HostService`]: the listener, sessions, lifecycle), `state` (what the sessions need of
//! the service), `process` (a process watched by pid and start time), `session` (one attached
//! task on the service's side), `upload` and `download` (the service's side of a writer's and
//! a gate's link), `handed` (pieces handed to a gate's task as they lie, and who frees them);
//! the task's side: `client` (the session's connection and requests), `attach`
//! ([`Attachment`], [`AttachedPartition`]), `writer` ([`AttachedWriter`]), `gate`
//! ([`AttachedGate`]).
//!
//! The top layer: it may use every layer below it (the service is a
//! [`crate::NetworkEnvironment`]).

mod attach;
mod client;
pub(crate) mod codec;
mod download;
mod gate;
mod handed;
mod link;
mod metrics;
mod name;
mod process;
mod records;
mod runtime;
mod service;
mod session;
mod state;
#[cfg(test)]
mod tests;
mod upload;
mod writer;

pub use attach::{AttachedPartition, Attachment};
pub use gate::AttachedGate;
pub use metrics::ServiceMetrics;
pub use name::{check_name, MAX_NAME_LEN};
pub use service::{HostConfig, HostService, LINK_TIMEOUT};
pub use writer::AttachedWriter;
