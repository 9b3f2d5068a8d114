"""Type stubs of the compiled core (``creditflow._native``); checked by ``mypy.stubtest``."""

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Literal, TypeAlias, final

import pyarrow as pa
from typing_extensions import Self, disjoint_base

from creditflow.metrics import EnvMetrics, GateMetrics, PartitionMetrics, ServiceMetrics

__version__: str

def parse_bytes(value: int | str) -> int:
    """Parses a byte size such as ``"64MiB"``, ``"32 KiB"`` or ``65536`` into bytes."""

def _drain_logs(timeout: float = 0.0) -> tuple[list[tuple[int, str, str]], int]:
    """Takes the queued Rust log records as ``(level, logger name, message)``, waiting up to
    ``timeout`` seconds (GIL released) for the first one, and how many were dropped."""

def _wake_logs() -> None:
    """Makes a waiting ``_drain_logs`` return now (to stop the forwarding thread)."""

def _set_log_level(level: int) -> None:
    """Makes Rust produce records at Python ``logging`` level ``level`` and above."""

def _permutation(n: int, seed: int) -> bytes:
    """The numbers ``0 .. n - 1`` in an order drawn uniformly at random from ``seed`` (the same
    seed, the same order), as ``n`` native-endian int64 values (``numpy.frombuffer``)."""

def _remove_spill_dirs() -> None:
    """Removes the spill directories of this process's environments that are still open
    (``creditflow.NetworkEnvironment`` registers it with :mod:`atexit`)."""

def _register_errors(classes: dict[str, type[Exception]]) -> None:
    """Registers the exception classes core errors are raised as: a dict from each class's name
    to the class, every one of them (``creditflow.errors`` calls it once, at import)."""

def settings() -> list[Setting]:
    """Every setting of ``NetworkEnvironment(...)``, in parameter order."""

@final
class Setting:
    """One setting of ``NetworkEnvironment(...)``: its name, default, unit and docs."""

    @property
    def name(self) -> str:
        """The keyword argument's name."""
    @property
    def py_type(self) -> str:
        """The parameter's type annotation, as the stub writes it."""
    @property
    def default(self) -> str:
        """The constructor's default, as a Python literal (``None``, ``0.1``, ``"credit"``)."""
    @property
    def means(self) -> str | None:
        """What a ``None`` default stands for, as a Python literal (``"64MiB"``), or None."""
    @property
    def unit(self) -> str:
        """What the value measures (``"bytes"``, ``"seconds"``, ``"buffers"``, ...)."""
    @property
    def keyword_only(self) -> bool:
        """Whether the parameter is keyword-only."""
    @property
    def doc(self) -> str:
        """One line of docs (Markdown)."""
    def __eq__(self, other: object, /) -> bool: ...
    __hash__: ClassVar[None]  # type: ignore[assignment]

@disjoint_base  # subclassed by creditflow.NetworkEnvironment (python/creditflow/env.py)
class NetworkEnvironment:
    """One per process: the buffer pool, partitions, gates, the listener and connections.

    The native half of ``creditflow.NetworkEnvironment``, which also forwards Rust log records to ``logging``
    and serves ``/metrics``. Settings (from the core's table, ``creditflow._native.settings()``; written by
    ``scripts/gen_settings.py``):

    - ``memory="64MiB"`` (bytes): network memory; the global pool holds ``memory // segment_size`` segments,
      allocated lazily, never more
    - ``segment_size="32KiB"`` (bytes): bytes per segment (a power of two of at least 4 KiB); larger segments
      cut per-buffer overhead for bulk transfers
    - ``bind="127.0.0.1:0"`` (address): listen address (port 0: ephemeral); a non-loopback bind needs a
      ``secret``, mutual ``tls`` or ``insecure=True``
    - ``secret=None`` (secret): shared secret: peers prove knowledge of it (HMAC challenge-response) before
      any other message
    - ``flow_control="credit"`` (choice): ``"credit"`` (Flink's credit-based flow control) or ``"tcp"`` (the
      pre-credit design, for teaching and comparison: one slow channel stalls its whole connection)
    - ``buffer_timeout=0.1`` (seconds): seconds until a partly filled buffer becomes readable; ``0`` = on
      every write
    - ``exclusive_buffers=2`` (buffers): credit per remote channel: buffers each remote channel of a gate owns
    - ``floating_buffers=8`` (buffers): credit per gate: buffers a gate lends to whichever of its channels has
      the largest backlog
    - ``insecure=False`` (flag): allow a non-loopback ``bind`` without a ``secret`` or mutual TLS (anyone who
      reaches it can read the data)
    - ``local_handoff=True`` (flag): hand batches to in-process readers without serializing; ``False`` =
      serialize into segments as for a remote reader
    - ``request_backoff_initial=0.1`` (seconds): first retry delay of a request for a partition the producer
      has not registered yet
    - ``request_backoff_max=10.0`` (seconds): largest retry delay; when a retry at it fails, the channel
      raises ``PartitionNotFoundError``
    - ``advertise=None`` (address): the ``host[:port]`` peers should use, when it is not the bound address
      (NAT, containers)
    - ``handshake_timeout=10.0`` (seconds): seconds a peer may take to connect and prove itself; a silent peer
      is dropped after it
    - ``max_connections=512`` (count): connections this environment serves at once (handshakes included); one
      more is refused with ``LimitExceededError``
    - ``max_channels_per_connection=16384`` (count): channels (partition requests) one connection may read at
      once; one more fails with ``LimitExceededError``
    - ``max_outstanding_requests=4096`` (count): answers queued for a peer that sends requests but does not
      read them; past it the connection is closed
    - ``tls=None`` (TLSConfig): ``TLSConfig(cert=..., key=..., ca=...)``: TLS on every connection (plaintext
      and TLS peers refuse each other)
    - ``peer_timeout=30.0`` (seconds): seconds a peer may acknowledge nothing (cut link, vanished host) before
      its connections fail with ``ConnectionLostError``; ``0`` = OS defaults (minutes)
    - ``overdraft_buffers=5`` (buffers): segments a partition may borrow beyond its share to finish a record
      it has started instead of stalling mid-record; out-pool usage can exceed 100% meanwhile (Flink's
      overdraft buffers; ``0`` = off)
    - ``debloat=False`` (flag): buffer debloating (Flink's FLIP-183): every gate has its producers cut buffers
      so its buffers in flight drain in ``debloat_target``
    - ``debloat_target=1.0`` (seconds): seconds the data in flight to a gate should take to drain (buffer
      debloating)
    - ``debloat_min_buffer=256`` (bytes): smallest buffer size buffer debloating announces, in bytes
    - ``spill_dir=None`` (path): where blocking and hybrid partitions spill: the environment makes its own
      subdirectory there and removes the ones of dead processes; ``None`` = ``creditflow-spill`` in the system
      temp dir
    - ``max_spill=None`` (bytes): bytes the environment's spill files may hold together; ``None`` = unbounded.
      At the cap a hybrid partition without replay backpressures, other spillable partitions fail with
      ``SpillError``
    - ``wire_compression=None`` (choice): Arrow IPC body compression (``"lz4"`` or ``"zstd"``) of the batches
      this environment serializes for readers (remote, or local with ``local_handoff=False``): pays on slow
      links, costs CPU on fast ones; ``None`` = uncompressed
    - ``shared_memory=True`` (flag): carry a connection's frames through shared memory instead of TCP when
      both environments offer it and run on one host as one user (Linux); the TCP handshake still
      authenticates. ``False`` here or on the peer: TCP
    """

    def __new__(
        cls,
        memory: int | str | None = None,
        segment_size: int | str | None = None,
        bind: str = "127.0.0.1:0",
        secret: bytes | str | None = None,
        flow_control: str = "credit",
        buffer_timeout: float = 0.1,
        exclusive_buffers: int = 2,
        floating_buffers: int = 8,
        *,
        insecure: bool = False,
        local_handoff: bool = True,
        request_backoff_initial: float = 0.1,
        request_backoff_max: float = 10.0,
        advertise: str | None = None,
        handshake_timeout: float = 10.0,
        max_connections: int = 512,
        max_channels_per_connection: int = 16384,
        max_outstanding_requests: int = 4096,
        tls: TLSConfig | None = None,
        peer_timeout: float = 30.0,
        overdraft_buffers: int = 5,
        debloat: bool = False,
        debloat_target: float = 1.0,
        debloat_min_buffer: int = 256,
        spill_dir: str | os.PathLike[str] | None = None,
        max_spill: int | str | None = None,
        wire_compression: str | None = None,
        shared_memory: bool = True,
    ) -> Self: ...
    @property
    def address(self) -> str:
        """The address other environments reach this one at, ``"host:port"``."""
    @property
    def segment_size(self) -> int:
        """Bytes per segment."""
    @property
    def total_segments(self) -> int:
        """Total segments (``memory // segment_size``)."""
    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
    def create_partition(
        self,
        partition_id: str,
        num_subpartitions: int = 1,
        *,
        kind: Literal["pipelined", "blocking", "hybrid"] = "pipelined",
        replay: bool = False,
        compression: Literal["lz4", "zstd"] | None = None,
    ) -> ResultPartition:
        """Creates a partition with ``num_subpartitions`` subpartitions of ``kind``
        (``"pipelined"``, ``"blocking"`` or ``"hybrid"``).

        - ``"pipelined"``: readers read while the writer writes; a slow reader backpressures
          the writer; each subpartition is read once.
        - ``"blocking"``: the writer never waits; what does not fit in memory spills to
          ``spill_dir``; readers get data once the partition is finished, from the start, as
          often and by as many readers as they like, until :meth:`ResultPartition.release`.
        - ``"hybrid"``: readers read while the writer writes; what a slow reader has not read
          yet spills instead of backpressuring. With ``replay=True`` everything is kept until
          release, so a later or repeated reader reads from the start; without, each
          subpartition is read once.

        ``compression`` (``"lz4"`` or ``"zstd"``) compresses what a blocking or hybrid
        partition stores (Arrow IPC body compression).
        """
    def create_input_gate(self, channels: Iterable[ChannelSpec]) -> InputGate:
        """Creates an input gate reading the given channels."""
    def reserve_memory(self, nbytes: int | str, what: str = "reservation") -> MemoryReservation:
        """Holds ``nbytes`` (an int or a string such as ``"8MiB"``; rounded up to whole segments)
        of this environment's memory for data kept outside its pools, such as rows a consumer
        has taken but not used yet: the pools' shares shrink by as much, so blocking and
        hybrid partitions spill down to fit within ``buffer_timeout``, and the total stays
        within ``memory``. Allocates nothing. Raises :class:`InsufficientBuffersError` when
        the pools' minimums leave less."""
    def metrics(self) -> EnvMetrics:
        """Metrics of the environment, its partitions and gates (``creditflow.metrics.EnvMetrics``)."""
    def close(self) -> None:
        """Closes connections and the listener, releases every partition and stops the
        background threads. Idempotent."""
    def __enter__(self) -> Self: ...
    def __exit__(self, *_args: object) -> bool:
        """Calls ``self.close()`` (a subclass's, which also stops what it started)."""

@final
class HostService:
    """The network stack of every task of this host attached to it (one per host, user and
    application): one pool (``memory`` is the host's), the partitions, the gates and one
    connection per pair of hosts. Tasks find it by ``name`` (see :func:`attach`)."""

    def __new__(
        cls,
        name: str,
        *,
        idle_timeout: float | None = None,
        memory: int | str | None = None,
        segment_size: int | str | None = None,
        bind: str = "127.0.0.1:0",
        secret: bytes | str | None = None,
        flow_control: str = "credit",
        buffer_timeout: float = 0.1,
        exclusive_buffers: int = 2,
        floating_buffers: int = 8,
        insecure: bool = False,
        local_handoff: bool = True,
        request_backoff_initial: float = 0.1,
        request_backoff_max: float = 10.0,
        advertise: str | None = None,
        handshake_timeout: float = 10.0,
        max_connections: int = 512,
        max_channels_per_connection: int = 16384,
        max_outstanding_requests: int = 4096,
        tls: TLSConfig | None = None,
        peer_timeout: float = 30.0,
        overdraft_buffers: int = 5,
        debloat: bool = False,
        debloat_target: float = 1.0,
        debloat_min_buffer: int = 256,
        spill_dir: str | os.PathLike[str] | None = None,
        max_spill: int | str | None = None,
        wire_compression: str | None = None,
        shared_memory: bool = True,
    ) -> HostService:
        """Takes the name (:class:`InvalidArgumentError` if a service of this user already
        has it on this host), starts the environment and listens. The settings are all of
        :class:`NetworkEnvironment`'s, with its defaults (``memory`` is the whole host's);
        ``idle_timeout``: end after this many seconds with no task attached (None: never)."""
    @property
    def address(self) -> str:
        """The address peers reach it at (``"host:port"``): what tasks put in their channel specs."""
    @property
    def name(self) -> str:
        """The name tasks attach by."""
    def metrics(self) -> ServiceMetrics:
        """Its pool, the tasks attached, its partitions, gates and connections, and how many
        batches reached reading tasks in place or copied."""
    def environment_metrics(self) -> EnvMetrics:
        """Metrics of the service's environment, which holds every attached task's partitions
        and gates: the same dict as :meth:`NetworkEnvironment.metrics`."""
    @property
    def closed(self) -> bool:
        """Whether the service has ended (:meth:`close`, its owners gone, idle for
        ``idle_timeout``)."""
    def wait(self, timeout: float | None = None) -> str:
        """Blocks until the service ends (its owners are gone, it was idle for
        ``idle_timeout``, or :meth:`close`) and returns why. The GIL is released and Ctrl-C
        interrupts."""
    def close(self) -> None:
        """Ends the service: attached tasks raise :class:`ConnectionLostError`, partitions are
        released, the spill directory removed and the name freed. Idempotent."""
    def __enter__(self) -> Self: ...
    def __exit__(self, *_args: object) -> bool: ...

@final
class Attachment:
    """A task's session with its host's service (made by :func:`attach`): creates partitions
    and gates that live in the service, with the API of :class:`NetworkEnvironment`'s."""

    @property
    def address(self) -> str:
        """The service's address: what peers put in their channel specs to read partitions
        created here."""
    @property
    def name(self) -> str:
        """The service's name."""
    @property
    def service_pid(self) -> int:
        """The service's pid."""
    @property
    def writer_heap(self) -> int:
        """Bytes of the heap each writer of this task places batches in: its ``memory``, in whole
        64 KiB chunks, from 1 MiB to 1 GiB."""
    @property
    def closed(self) -> bool:
        """Whether the attachment was closed or its service is gone."""
    def create_partition(
        self,
        partition_id: str,
        num_subpartitions: int = 1,
        *,
        kind: Literal["pipelined", "blocking", "hybrid"] = "pipelined",
        replay: bool = False,
        compression: Literal["lz4", "zstd"] | None = None,
    ) -> ResultPartition:
        """Creates a partition the service holds, as :meth:`NetworkEnvironment.create_partition`."""
    def create_input_gate(self, channels: Iterable[ChannelSpec]) -> InputGate:
        """Creates a gate in the service reading the given channels."""
    def metrics(self) -> ServiceMetrics:
        """The service's metrics."""
    def close(self) -> None:
        """Lets go of the session (it ends once the partitions, writers and gates made through
        it are gone too). Idempotent."""
    def __enter__(self) -> Self: ...
    def __exit__(self, *_args: object) -> bool: ...

def attach(name: str, *, owner: int = 0, memory: int | str | None = None) -> Attachment:
    """Attaches this process to the host service ``name`` of this user on this host.
    ``owner``: the pid of the process this task belongs to (a Spark executor), whose end may
    end the service (0: none). ``memory``: this task's own (bytes or a string such as
    ``"16MiB"``; None: ``NetworkEnvironment``'s default), as an environment's: each of its
    writers places batches in a heap of that much, whose pages count in this process once
    written. Raises :class:`ConnectionLostError` when no service answers."""

@final
class MemoryReservation:
    """Memory of a :class:`NetworkEnvironment` held by :meth:`NetworkEnvironment.reserve_memory`
    until :meth:`release` (or the reservation is dropped)."""

    @property
    def nbytes(self) -> int:
        """The bytes held (whole segments), 0 once released."""
    def release(self) -> None:
        """Gives the memory back to the environment's pools. Idempotent."""
    def __enter__(self) -> Self: ...
    def __exit__(self, *_args: object) -> bool:
        """Calls :meth:`release`."""

@final
class ResultPartition:
    """A partition: N subpartitions filled by a :class:`RecordWriter`."""

    @property
    def id(self) -> str:
        """The partition id."""
    @property
    def num_subpartitions(self) -> int:
        """Number of subpartitions."""
    @property
    def schema(self) -> pa.Schema | None:
        """Schema of the first batch written, or None."""
    @property
    def finished(self) -> bool:
        """Whether end-of-partition was sent."""
    @property
    def released(self) -> bool:
        """Whether the partition was released."""
    def flush(self) -> None:
        """Makes partly filled buffers readable now."""
    def release(self) -> None:
        """Drops queued data, returns the memory and unregisters the partition."""
    def wait_consumed(self, timeout: float | None = None) -> None:
        """Blocks until every reader received everything up to end-of-partition.

        The partition is then released. Raises :class:`TimeoutError` after ``timeout``
        seconds, and :class:`ConnectionLostError` when a reader went away (its process
        ended, its connection broke) before it had read everything. The GIL is released and
        Ctrl-C interrupts.
        """
    def metrics(self) -> PartitionMetrics:
        """This partition's metrics (``creditflow.metrics.PartitionMetrics``)."""

@final
class HashPartitioner:
    """Row r goes to ``pmod(hash(keys...), n)`` with Spark SQL's Murmur3 ``hash``."""

    def __new__(cls, keys: str | Sequence[str]) -> HashPartitioner: ...
    @property
    def keys(self) -> list[str]:
        """The key columns."""
    def check_schema(self, schema: pa.Schema) -> None:
        """Checks that batches of ``schema`` can be hashed by these keys (each key column exists
        and has a type Spark's ``hash`` takes); raises ``InvalidArgumentError`` otherwise."""

@final
class RoundRobinPartitioner:
    """Sends whole batches to the subpartitions in turn."""

    def __new__(cls) -> RoundRobinPartitioner: ...

@final
class BroadcastPartitioner:
    """Sends every batch to every subpartition (the data is shared, not copied)."""

    def __new__(cls) -> BroadcastPartitioner: ...

@final
class ForwardPartitioner:
    """Sends every batch to subpartition 0 (one-to-one; use with one subpartition)."""

    def __new__(cls) -> ForwardPartitioner: ...

Partitioner: TypeAlias = HashPartitioner | RoundRobinPartitioner | BroadcastPartitioner | ForwardPartitioner

@final
class TLSConfig:
    """TLS for every connection of a ``NetworkEnvironment`` (rustls): ``cert`` and ``key`` are
    the PEM files of the certificate chain this environment presents and its private key;
    ``ca`` the PEM file of the certificates it trusts: CA certificates peers' certificates
    must chain to, or peers' certificates themselves (a certificate in ``ca`` is trusted as
    it is, so a self-signed one made by ``openssl req -x509`` works as ``cert`` and ``ca`` on
    every side). With ``client_auth=True`` (default) TLS is mutual: servers also require a
    client certificate ``ca`` trusts. Certificates must be valid for the host part of the
    addresses peers use. ``creditflow certs`` makes a CA and node certificates.
    """

    def __new__(
        cls,
        cert: str | os.PathLike[str],
        key: str | os.PathLike[str],
        ca: str | os.PathLike[str],
        *,
        client_auth: bool = True,
    ) -> TLSConfig: ...
    @property
    def cert(self) -> Path:
        """The certificate chain file."""
    @property
    def key(self) -> Path:
        """The private key file."""
    @property
    def ca(self) -> Path:
        """The CA certificates file."""
    @property
    def client_auth(self) -> bool:
        """Whether TLS is mutual."""

@final
class ChannelSpec:
    """Where a channel reads from: a subpartition of a partition in some environment."""

    def __new__(cls, address: str, partition_id: str, subpartition: int) -> ChannelSpec: ...
    @property
    def address(self) -> str:
        """Address of the environment owning the partition."""
    @property
    def partition_id(self) -> str:
        """The partition id."""
    @property
    def subpartition(self) -> int:
        """The subpartition index."""
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class RecordWriter:
    """Writes Arrow data into a partition through a partitioner."""

    def __new__(
        cls,
        partition: ResultPartition,
        partitioner: Partitioner | None = None,
        *,
        timeout: float | None = None,
    ) -> RecordWriter: ...
    def write(self, data: object, timeout: float | None = None, *, subpartition: int | None = None) -> None:
        """Writes a batch, table or stream (any Arrow PyCapsule producer). With
        ``subpartition``, every batch goes whole to that subpartition (the partitioner is not
        asked); out of range raises ``InvalidArgumentError``."""
    def flush(self) -> None:
        """Makes partly filled buffers readable now."""
    def close(self) -> None:
        """Sends end-of-partition to every subpartition. Idempotent."""
    def broadcast_event(self, payload: bytes) -> None:
        """Sends a user event (at most 16 KiB) to every subpartition, in order with the
        batches; needs no buffer and no credit."""
    def emit_event(self, payload: bytes, subpartition: int) -> None:
        """Sends a user event (at most 16 KiB) to one subpartition."""
    def broadcast_barrier(self, checkpoint_id: int, *, unaligned: bool = False) -> list[int]:
        """Sends checkpoint barrier ``checkpoint_id`` (ids must increase) to every
        subpartition; returns, per subpartition, the queued entries an unaligned barrier
        overtook (``[]`` if aligned)."""
    def fail(self, message: str) -> None:
        """Ends the partition with an error that readers raise as ``ProducerFailedError``."""
    def metrics(self) -> PartitionMetrics:
        """The partition's metrics (``creditflow.metrics.PartitionMetrics``)."""
    def __enter__(self) -> Self: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc: BaseException | None = None,
        _tb: TracebackType | None = None,
    ) -> bool: ...

@final
class InputGate:
    """Reads batches from channels; iterate it, or call :meth:`next`."""

    def next(self, timeout: float | None = None) -> pa.RecordBatch | None:
        """The next batch; None once every channel has ended."""
    def __iter__(self) -> Self: ...
    def __next__(self) -> pa.RecordBatch: ...
    def next_item(self, timeout: float | None = None) -> GateItem | None:
        """The next batch, event, barrier or abort; None once every channel has ended."""
    def items(self, timeout: float | None = None) -> GateItems:
        """An iterator of :class:`Batch`, :class:`Event`, :class:`Barrier` and
        :class:`CheckpointAborted` items (the plain iterator yields only batches)."""
    @property
    def num_channels(self) -> int:
        """Number of channels."""
    @property
    def channels(self) -> list[ChannelSpec]:
        """The channels, in order."""
    def close(self) -> None:
        """Releases the channels."""
    def metrics(self) -> GateMetrics:
        """This gate's metrics (``creditflow.metrics.GateMetrics``)."""
    def __enter__(self) -> Self: ...
    def __exit__(self, *_args: object) -> bool: ...

@final
class Batch:
    """A batch from :meth:`InputGate.items`; ``in_flight`` lists the unaligned checkpoints it
    is in-flight data of (written before their barrier, yielded after it)."""

    def __new__(cls, channel: int, batch: pa.RecordBatch, in_flight: Sequence[int] = ...) -> Batch: ...
    @property
    def channel(self) -> int:
        """The channel it came from."""
    @property
    def batch(self) -> pa.RecordBatch:
        """The batch."""
    @property
    def in_flight(self) -> list[int]:
        """Ids of the unaligned checkpoints whose barrier overtook it (usually empty)."""

@final
class Event:
    """A user event from :meth:`InputGate.items`."""

    def __new__(cls, channel: int, payload: bytes) -> Event: ...
    @property
    def channel(self) -> int:
        """The channel it came from."""
    @property
    def payload(self) -> bytes:
        """The bytes the writer sent."""
    def __eq__(self, other: object, /) -> bool: ...
    __hash__: ClassVar[None]  # type: ignore[assignment]

@final
class Barrier:
    """Checkpoint barrier ``checkpoint_id`` from :meth:`InputGate.items` (aligned: every
    channel delivered it; unaligned: the first channel did)."""

    def __new__(cls, checkpoint_id: int, unaligned: bool = False) -> Barrier: ...
    @property
    def checkpoint_id(self) -> int:
        """The checkpoint id."""
    @property
    def unaligned(self) -> bool:
        """Whether it is an unaligned barrier."""
    def __eq__(self, other: object, /) -> bool: ...
    __hash__: ClassVar[None]  # type: ignore[assignment]

@final
class CheckpointAborted:
    """The alignment of ``checkpoint_id`` was abandoned: a higher id arrived first."""

    def __new__(cls, checkpoint_id: int) -> CheckpointAborted: ...
    @property
    def checkpoint_id(self) -> int:
        """The checkpoint id."""
    def __eq__(self, other: object, /) -> bool: ...
    __hash__: ClassVar[None]  # type: ignore[assignment]

GateItem: TypeAlias = Batch | Event | Barrier | CheckpointAborted

@final
class GateItems:
    """Iterates an :class:`InputGate`'s items (see :meth:`InputGate.items`)."""

    def __iter__(self) -> Self: ...
    def __next__(self) -> GateItem: ...
