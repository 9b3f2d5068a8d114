"""The exceptions creditflow raises: one hierarchy under :class:`CreditflowError`.

Where a built-in exception fits, the creditflow exception subclasses it too, so
``except TimeoutError`` or ``except ValueError`` work as a Python user expects.
"""

from __future__ import annotations

import builtins

from creditflow import _native

__all__ = [
    "AlreadyConsumedError",
    "AuthenticationError",
    "ClosedError",
    "ConnectionLostError",
    "CreditflowError",
    "InsufficientBuffersError",
    "InvalidArgumentError",
    "LimitExceededError",
    "PartitionNotFoundError",
    "ProducerFailedError",
    "ProtocolError",
    "SchemaMismatchError",
    "SpillError",
    "TimeoutError",
]


class CreditflowError(Exception):
    """Base class of every error raised by creditflow."""


class InsufficientBuffersError(CreditflowError):
    """A pool's guaranteed minimum of segments does not fit into the environment's memory.

    Raised at construction (of a partition or gate), never later as a hang. The message
    names the numbers and the setting to change; they are also attributes.
    """

    def __init__(
        self,
        message: str,
        *,
        required: int = 0,
        available: int = 0,
        total: int = 0,
        segment_size: int = 0,
    ) -> None:
        super().__init__(message)
        self.required = required
        self.available = available
        self.total = total
        self.segment_size = segment_size


class PartitionNotFoundError(CreditflowError, LookupError):
    """No partition with the requested id was registered before the request backoff ran out."""


class ConnectionLostError(CreditflowError, ConnectionError):
    """The connection to a peer environment was lost."""


class AuthenticationError(CreditflowError, PermissionError):
    """A peer failed the shared-secret handshake."""


class LimitExceededError(CreditflowError, ConnectionError):
    """A peer refused this environment because one of its limits was reached:
    ``max_connections``, ``max_channels_per_connection`` or ``max_outstanding_requests``.
    The message names the limit and the setting that raises it on the serving side."""


class ProtocolError(CreditflowError):
    """A peer (or a corrupted stream) broke the wire protocol."""


class TimeoutError(CreditflowError, builtins.TimeoutError):  # noqa: A001 - deliberate: a creditflow TimeoutError
    """A blocking call (``write``, ``next``) passed its ``timeout``. Nothing was lost: the
    batch was not written (or not read) and the call can be retried."""


class SchemaMismatchError(CreditflowError, ValueError):
    """A batch's schema differs from the schema of the partition's first batch."""


class InvalidArgumentError(CreditflowError, ValueError):
    """A bad argument: an unknown key column, a malformed size, an impossible setting."""


class ClosedError(CreditflowError, ValueError):
    """The environment, partition, writer or gate is closed."""


class AlreadyConsumedError(CreditflowError, ValueError):
    """A subpartition already has a reader; pipelined subpartitions are read once."""


class ProducerFailedError(CreditflowError):
    """The producer of a channel failed in the middle of a batch; the stream is incomplete."""


class SpillError(CreditflowError, OSError):
    """Spilling to disk failed: the disk is full, a write or read failed, or the
    environment's ``max_spill`` was reached. The message names the directory or file and the
    bytes. The partition is marked failed: its readers raise :class:`ProducerFailedError`."""


# The compiled module raises these classes for core errors; it is handed them here, once,
# instead of looking them up by name each time (creditflow/__init__ imports this module
# before anything can raise).
_native._register_errors(
    {
        cls.__name__: cls
        for cls in (
            InsufficientBuffersError,
            PartitionNotFoundError,
            InvalidArgumentError,
            AlreadyConsumedError,
            SchemaMismatchError,
            TimeoutError,
            ClosedError,
            ProtocolError,
            ConnectionLostError,
            AuthenticationError,
            LimitExceededError,
            ProducerFailedError,
            SpillError,
        )
    }
)
