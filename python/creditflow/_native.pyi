"""Type stubs of the compiled core (``creditflow._native``); checked by ``mypy.stubtest``."""

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, TypeAlias, final

import pyarrow as pa
from typing_extensions import Self

from creditflow.prometheus import MetricsServer

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

@final
class NetworkEnvironment:
    """One per process: the buffer pool, partitions, gates, the listener and connections.

    ``memory`` / ``segment_size``: network memory and segment size (ints or ``"64MiB"``).
    ``bind``: listen address (port 0 = ephemeral); ``advertise``: the ``host[:port]`` peers
    should use when that differs (NAT, containers). ``secret``: shared secret; peers prove
    knowledge of it with an HMAC challenge-response before any other message. Without one,
    binding a non-loopback address is refused unless ``insecure=True``. ``flow_control``:
    ``"credit"`` (Flink's credit-based flow control) or ``"tcp"`` (the pre-credit design,
    kept as a teaching/comparison mode: one slow channel stalls its whole connection).
    ``exclusive_buffers`` per remote channel, ``floating_buffers`` per gate.
    ``request_backoff_initial`` / ``request_backoff_max``: retry delays of a request for a
    partition the producer has not registered yet, then ``PartitionNotFoundError``.
    ``handshake_timeout``: seconds a peer may take to connect and prove itself; a peer that
    connects and stays silent is dropped after it. Limits against abusive peers (each hit
    refuses only that peer, with ``LimitExceededError`` naming the setting):
    ``max_connections`` served at once, ``max_channels_per_connection`` (partition requests
    served per connection), ``max_outstanding_requests`` (answers queued for a peer that
    does not read them). ``tls``: a :class:`TLSConfig` for every connection (plaintext and TLS
    peers refuse each other); with mutual TLS a non-loopback bind needs no ``secret``.
    ``peer_timeout``: seconds after which a connection whose peer acknowledges nothing (a cut
    link, a vanished host) fails with ``ConnectionLostError``; ``0`` leaves the OS defaults.
    ``overdraft_buffers``: segments a partition may borrow beyond its share to finish a record
    it has started writing when its pool is exhausted (Flink's overdraft buffers; 0 turns
    them off). ``debloat``: buffer debloating (Flink's FLIP-183, off by default): every gate
    measures the bytes it consumes per second and has its producers cut buffers at
    ``throughput × debloat_target / buffers`` bytes (``buffers``: exclusive buffers of every
    channel plus the floating ones), at least ``debloat_min_buffer`` bytes and at most a
    segment, announced when it changes by 25% or more; segments stay whole, only the fill
    point moves, so the data in flight to a slow consumer (and a marker queued behind it)
    drains in about ``debloat_target`` seconds per gate's worth of buffers.
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
    ) -> NetworkEnvironment: ...
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
    def create_partition(self, partition_id: str, num_subpartitions: int = 1) -> ResultPartition:
        """Creates a partition with ``num_subpartitions`` pipelined subpartitions."""
    def create_input_gate(self, channels: Iterable[ChannelSpec]) -> InputGate:
        """Creates an input gate reading the given channels."""
    def metrics(self) -> dict[str, Any]:
        """Metrics of the environment, its partitions and gates, as a dict."""
    def serve_metrics(self, port: int = 0, addr: str = "127.0.0.1") -> MetricsServer:
        """Serves this environment's metrics in the Prometheus text format at
        ``http://addr:port/metrics`` (``port=0``: any free port) until the environment closes."""
    def close(self) -> None:
        """Closes connections and the listener, releases every partition, stops background
        threads and `/metrics` servers. Idempotent."""
    def __enter__(self) -> Self: ...
    def __exit__(self, *_args: object) -> bool: ...

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
        seconds. The GIL is released and Ctrl-C interrupts.
        """
    def metrics(self) -> dict[str, Any]:
        """This partition's metrics, as a dict."""

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
    ``ca`` the PEM file of the CA certificates peers' certificates must chain to. With
    ``client_auth=True`` (default) TLS is mutual: servers also require a client certificate
    signed by ``ca``. Certificates must be valid for the host part of the addresses peers use.
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
    def write(self, data: object, timeout: float | None = None) -> None:
        """Writes a batch, table or stream (any Arrow PyCapsule producer)."""
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
    def metrics(self) -> dict[str, Any]:
        """The partition's metrics, as a dict."""
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
    def metrics(self) -> dict[str, Any]:
        """This gate's metrics, as a dict."""
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
