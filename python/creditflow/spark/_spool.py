"""The store behind ``Receiver(spill=True)``: what the Spark tasks delivered and the consumer
has not taken yet, in a hybrid partition of the receiver's own environment.

The receiver's reader threads write every batch they get from a task into one subpartition
through one shared :class:`creditflow.RecordWriter` (its writes are whole batches, one at a
time, so batches of different tasks interleave as they arrive, as in the queue of a receiver
without spilling). The consumer reads that subpartition through a local
:class:`creditflow.InputGate`, a *pass*. A hybrid partition never makes its writer wait for a
slow reader: what does not fit in the environment's memory spills to its ``spill_dir``, so the
reader threads keep up with Spark and the job finishes. With ``replay`` everything stays until
:meth:`Spool.release`, and every new pass reads the whole stream from the start; without, the
one pass frees what it read (and at ``max_spill`` the writer waits for it: backpressure).

One subpartition rather than one per task: the tasks register one by one and their number is
known only when the job registers, while the partition (and the consumer's gate) exist from the
start; a single stream also keeps the order the consumer sees the same as without spilling.
"""

from __future__ import annotations

import threading
import uuid

import pyarrow as pa

import creditflow as cf
from creditflow.metrics import SpillMetrics


class Spool:
    """A hybrid partition of ``env`` with one writer shared by threads and one reading pass
    at a time."""

    def __init__(self, env: cf.NetworkEnvironment, *, replay: bool) -> None:
        self.replay = replay
        self._env = env
        part_id = f"cf-receiver/{uuid.uuid4().hex[:12]}"
        self._part = env.create_partition(part_id, 1, kind="hybrid", replay=replay)
        self._writer = cf.RecordWriter(self._part, cf.ForwardPartitioner())
        # Writes one at a time, so that after a failed one the next sees its cause.
        self._write_lock = threading.Lock()
        self._lock = threading.Lock()
        self._gate: cf.InputGate | None = None
        self._failure: str | None = None
        self._ended = False

    @property
    def failure(self) -> str | None:
        """Why the stream failed (the first cause: a :class:`creditflow.SpillError`, the
        message given to :meth:`fail`), or None."""
        with self._lock:
            return self._failure

    def _note(self, message: str) -> None:
        with self._lock:
            if self._failure is None and not self._ended:
                self._failure = message

    def put(self, batch: pa.RecordBatch) -> None:
        """Appends ``batch`` (any reader thread). Waits only without replay at ``max_spill``;
        raises :class:`creditflow.SpillError` when the batch cannot be kept (the partition
        then fails), :class:`creditflow.ProducerFailedError` naming the cause once the
        stream failed, :class:`creditflow.ClosedError` after :meth:`release`."""
        with self._write_lock:
            if (failure := self.failure) is not None:
                raise cf.ProducerFailedError(failure)
            try:
                self._writer.write(batch)
            except cf.SpillError as exc:
                self._note(f"SpillError: {exc}")
                raise

    def end(self) -> None:
        """Ends the stream: a pass that read everything sees the end."""
        self._writer.close()
        with self._lock:
            self._ended = True

    def fail(self, message: str) -> None:
        """Ends the stream with an error: a pass raises :class:`creditflow.ProducerFailedError`
        with ``message`` after the batches before it (nothing after a failure or an end)."""
        self._note(message)  # first: a write that then finds the stream ended names it
        self._writer.fail(message)

    def next(self, timeout: float | None) -> pa.RecordBatch | None:
        """The current pass's next batch (starting the first pass); None at the end."""
        with self._lock:
            if self._gate is None:
                self._gate = self._open()
            gate = self._gate
        return gate.next(timeout=timeout)

    def restart(self) -> None:
        """Starts a new pass from the start of the stream (needs ``replay``)."""
        assert self.replay, "only a replaying spool is read more than once"
        with self._lock:
            old, self._gate = self._gate, self._open()
        if old is not None:
            old.close()

    def _open(self) -> cf.InputGate:
        return self._env.create_input_gate([cf.ChannelSpec(self._env.address, self._part.id, 0)])

    def metrics(self) -> SpillMetrics:
        """The partition's store: what it holds in memory and on disk, and what it spilled."""
        spill = self._part.metrics()["spill"]
        assert spill is not None, "a hybrid partition has a store"
        return spill

    def release(self) -> None:
        """Drops the stream and removes its spill file; a writer waiting for room fails with
        :class:`creditflow.ClosedError`. The pass's gate closes. Idempotent."""
        self._part.release()
        with self._lock:
            gate, self._gate = self._gate, None
        if gate is not None:
            gate.close()
