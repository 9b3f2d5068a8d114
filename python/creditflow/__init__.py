"""creditflow: Apache Flink's network stack for Arrow record batches.

Bounded-memory, backpressured exchange of Arrow record batches between threads, processes
and PySpark tasks::

    import creditflow as cf

    with cf.NetworkEnvironment(memory="64MiB") as env:
        part = env.create_partition("job/stage/0", num_subpartitions=4)
        gate = env.create_input_gate([cf.ChannelSpec(env.address, "job/stage/0", i) for i in range(4)])
        with cf.RecordWriter(part, cf.HashPartitioner(["key"])) as w:
            w.write(batch)
        for batch in gate:
            ...

Importing this package starts no thread and no runtime (Spark forks its Python workers);
a :class:`NetworkEnvironment` starts its one background thread when it is created.
"""

from __future__ import annotations

from creditflow._native import (
    Barrier,
    Batch,
    BroadcastPartitioner,
    ChannelSpec,
    CheckpointAborted,
    Event,
    ForwardPartitioner,
    HashPartitioner,
    InputGate,
    MemoryReservation,
    RecordWriter,
    ResultPartition,
    RoundRobinPartitioner,
    TLSConfig,
    __version__,
    parse_bytes,
)
from creditflow.env import NetworkEnvironment
from creditflow.errors import (
    AlreadyConsumedError,
    AuthenticationError,
    ClosedError,
    ConnectionLostError,
    CreditflowError,
    InsufficientBuffersError,
    InvalidArgumentError,
    LimitExceededError,
    PartitionNotFoundError,
    ProducerFailedError,
    ProtocolError,
    SchemaMismatchError,
    SpillError,
    TimeoutError,
)
from creditflow.host import Attachment, HostService, attach

#: What :meth:`InputGate.items` yields.
GateItem = Batch | Event | Barrier | CheckpointAborted

__all__ = [
    "AlreadyConsumedError",
    "Attachment",
    "AuthenticationError",
    "Barrier",
    "Batch",
    "BroadcastPartitioner",
    "ChannelSpec",
    "CheckpointAborted",
    "ClosedError",
    "ConnectionLostError",
    "CreditflowError",
    "Event",
    "ForwardPartitioner",
    "GateItem",
    "HashPartitioner",
    "HostService",
    "InputGate",
    "InsufficientBuffersError",
    "InvalidArgumentError",
    "LimitExceededError",
    "MemoryReservation",
    "NetworkEnvironment",
    "PartitionNotFoundError",
    "ProducerFailedError",
    "ProtocolError",
    "RecordWriter",
    "ResultPartition",
    "RoundRobinPartitioner",
    "SchemaMismatchError",
    "SpillError",
    "TLSConfig",
    "TimeoutError",
    "__version__",
    "attach",
    "parse_bytes",
]
