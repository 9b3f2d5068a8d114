"""The types of ``metrics()`` results: plain dicts, typed as :class:`~typing.TypedDict`.

Each type is named after the Rust struct it mirrors, with the same keys and nesting
(``rust/python/src/metrics.rs`` writes every key from the struct's field name), so a name
read in Python is the name in the Rust source. On top of the fields, a few values the core
computes are included under the name of the Rust method that computes them
(``PoolStats.usage``, ``PartitionMetrics.out_pool_usage`` / ``level`` /
``busy_ms_per_second``, ``GateMetrics.busy_ms_per_second``).

Conventions: durations are seconds (``float``; ``backpressured_total``, ``idle_total``);
``..._ms_per_second`` is milliseconds of the last second; counters (``..._written``,
``..._received``, ``..._sent``, ``..._out``) only grow; a part that does not apply is
``None`` (``remote`` of a local channel, ``debloat`` with debloating off).

``env.metrics()`` returns :class:`EnvMetrics`, ``partition.metrics()`` and
``writer.metrics()`` :class:`PartitionMetrics`, ``gate.metrics()`` :class:`GateMetrics`.
"""

from __future__ import annotations

from typing import Literal, TypedDict

__all__ = [
    "BUSY_THRESHOLD",
    "ChannelMetrics",
    "ChannelSpecFields",
    "DebloatMetrics",
    "EnvMetrics",
    "GateMetrics",
    "PartitionMetrics",
    "PoolStats",
    "RankMetrics",
    "ReceiverMetrics",
    "RemoteChannelStats",
    "RemoteReaderMetrics",
    "RemoteStats",
    "ServiceMetrics",
    "SpillDirMetrics",
    "SpillMetrics",
    "SubpartitionMetrics",
    "level_of",
]


class PoolStats(TypedDict):
    """A local buffer pool (``PoolStats``), in segments."""

    #: Guaranteed minimum.
    min: int
    #: Upper bound on the share; None: unbounded.
    max: int | None
    #: Current share: how many segments this pool may hold.
    share: int
    #: Segments taken from the global pool (free here + in use).
    held: int
    #: Segments in use (handed out and not yet recycled).
    in_use: int
    #: ``in_use / share`` (Flink's in/out pool usage); can exceed 1 briefly.
    usage: float


class RemoteReaderMetrics(TypedDict):
    """What the sender side did for a subpartition's remote reader (``RemoteReaderMetrics``)."""

    #: The consumer's connection address.
    peer: str
    #: What carries the frames to it: ``"tcp"`` (TCP or TLS) or ``"shm"`` (shared memory).
    transport: str
    #: Buffers the sender may still send (the receiver's credit).
    credit: int
    #: Data buffers written to the connection.
    buffers_sent: int
    #: Payload bytes written to the connection.
    bytes_sent: int


class SubpartitionMetrics(TypedDict):
    """One subpartition (``SubpartitionMetrics``)."""

    #: Index in the partition.
    index: int
    #: Finished buffers/batches waiting for the reader.
    backlog: int
    #: Whether a reader attached.
    consumed: bool
    #: Buffers the reader took.
    buffers_out: int
    #: Bytes the reader took.
    bytes_out: int
    #: The remote reader's view; None when the reader is local or there is none yet.
    remote: RemoteReaderMetrics | None


class SpillMetrics(TypedDict):
    """A blocking or hybrid partition's store (``PartitionMetrics["spill"]``)."""

    #: ``"blocking"`` or ``"hybrid"``.
    kind: str
    #: Whether the stream is kept for repeated reads (blocking, or hybrid with ``replay``).
    replay: bool
    #: Stream bytes stored (serialized, after compression).
    stream_bytes: int
    #: Bytes written to the spill file.
    spilled_bytes: int
    #: Chunks (of at most a segment) written to the spill file.
    spilled_chunks: int
    #: Bytes read back from the spill file, by every reader.
    read_back_bytes: int
    #: Chunks read back from the spill file.
    read_back_chunks: int
    #: Bytes the spill file holds now (0 once released).
    disk_bytes: int
    #: Segments of the partition's pool the store holds now.
    memory_segments: int
    #: Spill files open now.
    files: int


class PartitionMetrics(TypedDict):
    """A partition (``PartitionMetrics``)."""

    #: Partition id.
    id: str
    #: Number of subpartitions.
    num_subpartitions: int
    #: The partition's (output) pool.
    pool: PoolStats
    #: Finished buffers/batches waiting, per subpartition.
    backlog: list[int]
    #: Batches written (a hash split counts each piece).
    batches_written: int
    #: Buffers (segments filled or batches handed off) published.
    buffers_written: int
    #: Arrow payload bytes written.
    bytes_written: int
    #: Rows written.
    rows_written: int
    #: Milliseconds writers spent blocked on a buffer, over the last second.
    backpressured_ms_per_second: float
    #: Seconds writers spent blocked on a buffer since the partition was created.
    backpressured_total: float
    #: Whether end-of-partition was sent.
    finished: bool
    #: A blocking or hybrid partition's store and spilling; ``None`` for a pipelined one.
    spill: SpillMetrics | None
    #: Per-subpartition detail, by index.
    subpartitions: list[SubpartitionMetrics]
    #: Output pool usage: segments in use / pool share.
    out_pool_usage: float
    #: Backpressure level from ``backpressured_ms_per_second``: OK <= 100, LOW <= 500, HIGH.
    level: Literal["OK", "LOW", "HIGH"]
    #: Milliseconds of the last second writers were not blocked on a buffer.
    busy_ms_per_second: float


class RemoteStats(TypedDict):
    """A gate's remote buffers and credit (``RemoteStats``)."""

    #: Remote channels opened by the gate.
    remote_channels: int
    #: Exclusive buffers of channels still open.
    exclusive_total: int
    #: Exclusive buffers holding received data not yet read.
    exclusive_in_use: int
    #: Floating buffers of the gate.
    floating_total: int
    #: Floating buffers assigned to channels.
    floating_in_use: int
    #: Empty buffers announced to senders (their credit, in flight included).
    credit_announced: int
    #: Empty buffers not yet announced.
    credit_unannounced: int
    #: Received buffers waiting to be read.
    queued_buffers: int
    #: Bytes of records in progress plus completed and not yet taken by the consumer.
    record_bytes: int
    #: The largest ``record_bytes`` so far.
    record_bytes_peak: int
    #: Record bytes granted to senders and not used yet.
    record_bytes_granted: int
    #: The gate's record budget: records start only while held + granted is under it.
    record_budget: int
    #: Record buffers allocated fresh (each costs page faults as it is first written).
    record_blocks_allocated: int
    #: Record buffers used again after the batches over them were dropped.
    record_blocks_reused: int


class DebloatMetrics(TypedDict):
    """What a gate's buffer debloating measured and announced (``DebloatMetrics``)."""

    #: The buffer size last announced to the producers, in bytes.
    buffer_size: int
    #: The buffer size the last sample computed, announced or not.
    desired_buffer_size: int
    #: Smoothed bytes consumed per second of time not spent waiting for data.
    throughput: float
    #: Buffers that can be in flight to the gate (the divisor of the size).
    buffers: int


class ChannelSpecFields(TypedDict):
    """Where a channel reads from (``ChannelSpec``'s fields)."""

    #: Address of the environment owning the partition.
    address: str
    #: Partition id.
    partition_id: str
    #: Subpartition index.
    subpartition: int


class RemoteChannelStats(TypedDict):
    """A remote channel's buffers and credit (``RemoteChannelStats``)."""

    #: Exclusive buffers holding received data not yet read.
    exclusive_in_use: int
    #: Floating buffers assigned to the channel.
    floating_in_use: int
    #: Empty buffers announced to the sender (its credit, in flight included).
    credit_announced: int
    #: Empty buffers not yet announced.
    credit_unannounced: int
    #: The sender's last announced backlog plus the exclusive buffers (buffers wanted).
    required: int
    #: Received buffers waiting to be read.
    queued_buffers: int
    #: Bytes of records in progress plus completed and not yet taken by the consumer.
    record_bytes: int
    #: The largest ``record_bytes`` so far.
    record_bytes_peak: int
    #: What carries the channel's frames: ``"tcp"`` (TCP or TLS) or ``"shm"`` (shared memory).
    transport: str


class ChannelMetrics(TypedDict):
    """One channel of a gate (``ChannelMetrics``)."""

    #: Index in the gate.
    index: int
    #: Which subpartition it reads, and where.
    spec: ChannelSpecFields
    #: How it reads now.
    kind: Literal["pending", "local", "remote", "ended"]
    #: Batches received.
    batches_received: int
    #: Buffers received.
    buffers_received: int
    #: Arrow bytes received.
    bytes_received: int
    #: Rows received.
    rows_received: int
    #: Buffers and credit, for a remote channel; None otherwise.
    remote: RemoteChannelStats | None


class GateMetrics(TypedDict):
    """An input gate (``GateMetrics``)."""

    #: Gate name.
    name: str
    #: Number of channels.
    num_channels: int
    #: Channels that reached the end.
    ended_channels: int
    #: The gate's (input) pool: exclusive + floating buffers of remote channels.
    pool: PoolStats
    #: Batches (and events, barriers) decoded but not yet returned.
    queued_batches: int
    #: Checkpoint barriers ignored as stale.
    stale_barriers: int
    #: Batches received.
    batches_received: int
    #: Buffers (serialized buffers or handed-off batches) received.
    buffers_received: int
    #: Arrow bytes received.
    bytes_received: int
    #: Rows received.
    rows_received: int
    #: Milliseconds the reader waited for data, over the last second.
    idle_ms_per_second: float
    #: Seconds the reader waited for data since the gate was created.
    idle_total: float
    #: Buffers and credit of the remote channels; None without remote channels.
    remote: RemoteStats | None
    #: Buffer debloating; None when it is off.
    debloat: DebloatMetrics | None
    #: Per-channel detail, by index.
    channels: list[ChannelMetrics]
    #: Milliseconds of the last second the reader was not waiting for data.
    busy_ms_per_second: float


class SpillDirMetrics(TypedDict):
    """An environment's spill directory (``EnvMetrics["spill"]``)."""

    #: The environment's own directory (under ``spill_dir``).
    path: str
    #: Bytes its spill files hold now.
    disk_bytes: int
    #: ``max_spill``; None: unbounded.
    max_spill: int | None
    #: Bytes ever written to spill files.
    written_bytes: int
    #: Spill files ever created.
    files_created: int
    #: Directories of dead processes removed when this one was opened.
    swept_dirs: int


class ServiceMetrics(TypedDict):
    """A host service: the host's pool, the tasks attached, its connections (``ServiceMetrics``)."""

    #: The service's address.
    address: str
    #: Bytes per segment.
    segment_size: int
    #: Segments in the host's pool (``memory // segment_size``).
    segments_total: int
    #: Segments no local pool holds.
    segments_available: int
    #: Sum of the local pools' minimums.
    segments_reserved: int
    #: Tasks attached now.
    sessions: int
    #: Partitions registered.
    partitions: int
    #: Gates the service serves now (one that ended, or whose task let it go, is not counted).
    gates: int
    #: Connections the service opened to other services (one per address it reads from).
    connections_opened: int
    #: Connections other services opened to this one.
    connections_served: int
    #: Batches handed to a reading task where the writing task put them (a piece in its
    #: writer link's heap), not copied: since the service started.
    batches_in_place: int
    #: Batches copied onto a reading task's link (small pieces, pieces that did not fit the
    #: writer link's heap, batches from other hosts): since the service started.
    batches_copied: int
    #: Batches handed to a reading task in place that it never let go, whose writer link's
    #: chunks the service freed: the task closed its gate before reading them, or ended
    #: holding them. Since the service started.
    pieces_reclaimed: int


class EnvMetrics(TypedDict):
    """An environment, its partitions and gates (``EnvMetrics``)."""

    #: ``env.address``.
    address: str
    #: Bytes per segment.
    segment_size: int
    #: The global pool's cap.
    segments_total: int
    #: Segments not held by any local pool.
    segments_available: int
    #: Segments allocated so far (lazily).
    segments_allocated: int
    #: Sum of local pools' guaranteed minimums.
    segments_reserved: int
    #: Registered partitions, by id.
    partitions: dict[str, PartitionMetrics]
    #: Open gates, by name.
    gates: dict[str, GateMetrics]
    #: The spill directory, once a blocking or hybrid partition opened it (else ``None``).
    spill: SpillDirMetrics | None
    #: Connections this environment opened and that are up: one per remote address its gates
    #: read from, shared by all their channels.
    connections_opened: int
    #: Connections other environments opened to this one that are up.
    connections_served: int


class RankMetrics(TypedDict):
    """A training rank's progress (``Receiver.rank_metrics()``; computed in Python)."""

    rank: int
    world_size: int
    #: The current epoch and the batches the trainer took in it.
    epoch: int
    batches: int
    #: Rows yielded since the receiver started, over every epoch.
    rows_yielded: int
    #: Rows this rank holds (its share of the stream, kept for the later epochs).
    rows_held: int
    #: Pieces received and not yet taken by the consumer (epoch 0), rows in its window, and
    #: rows of epoch 0 left in the runs while the ranks' bound held the consumer back.
    queued: int
    window_rows: int
    rows_parked: int
    #: Whether this rank has its whole share; the epoch's number of batches once settled.
    stream_ended: bool
    steps: int | None
    #: The data stall: milliseconds of the last second the consumer waited in ``next()``
    #: for a batch, and seconds in total.
    stall_ms_per_second: float
    stall_total: float
    #: The tasks' backpressure from this rank: milliseconds of the last second its trainer
    #: held the tasks back (the rank's queue was full, its readers waited), and seconds in all.
    backpressure_ms_per_second: float
    backpressure_total: float
    #: What holds the rank back now: ``"trainer"`` (the tasks wait for it most of each
    #: second), ``"spark"`` (its trainer waits for data most of each second in epoch 0),
    #: ``"ranks"`` (it waits for the other ranks' rows: a later epoch's deal, the end of
    #: epoch 0), or None.
    bottleneck: str | None
    #: What the rank holds now: its environment's allocated segments plus the rows held
    #: outside them (queue, window) at the largest average row size seen; its ``memory``;
    #: and the part of it reserved for the rows held outside the pools.
    memory_bytes: int
    memory_limit: int
    reserved_bytes: int


class ContinuousMetrics(TypedDict):
    """The jobs of a ``Receiver(continuous=True)`` (``Receiver.metrics()["continuous"]``;
    computed in Python). A job is one ``send`` or one micro-batch of the ``creditflow`` sink."""

    #: Jobs committed (every partition received whole, the job succeeded) and the rows in them.
    jobs_committed: int
    rows_committed: int
    #: Jobs the consumer took whole (up to their boundary) and the rows it took.
    jobs_delivered: int
    rows_delivered: int
    #: Replays of micro-batches committed already (Spark retried or replayed them), dropped.
    replays_dropped: int
    #: Jobs dropped before they committed (failed, aborted, a partition not received whole,
    #: superseded by another run of the query) and the rows they held.
    jobs_dropped: int
    rows_dropped: int
    #: Partition attempts dropped: broke off, failed in their task, or read whole but not the
    #: attempt Spark kept (a retry's predecessor whose input ended early, a speculative copy).
    attempts_failed: int
    #: Jobs and partitions received and not yet committed.
    jobs_staged: int
    partitions_staged: int
    #: Committed batches the consumer has not taken yet; beyond ``max_queued`` the receiver
    #: stops reading the tasks (backpressure), for ``paused_seconds`` so far in all.
    backlog_batches: int
    paused_seconds: float
    #: The last micro-batch of each stream (query id) that the consumer took whole.
    last_batch_ids: dict[str, int]


class ReceiverMetrics(EnvMetrics):
    """``Receiver.metrics()``: its environment's metrics and, for a rank, the rank's; for a
    continuous receiver, its jobs'."""

    rank: RankMetrics | None
    continuous: ContinuousMetrics | None


#: A task busier than this share of a second counts as busy.
BUSY_THRESHOLD = 0.5


def level_of(backpressured_ratio: float) -> str:
    """Flink's level for a share of time backpressured: OK <= 0.1 < LOW <= 0.5 < HIGH."""
    if backpressured_ratio <= 0.10:
        return "OK"
    if backpressured_ratio <= 0.50:
        return "LOW"
    return "HIGH"
