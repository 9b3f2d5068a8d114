"""The two modes of a single (rankless) :class:`creditflow.spark.Receiver`: each is the
:class:`~creditflow.spark._intake.Sink` its reader threads write to and what its consumer
reads from.

* :class:`Direct`: batches go through a bounded queue; a slow consumer holds back credit, so
  the Spark tasks wait for it (backpressure).
* :class:`Spooled` (``spill=True``): batches go to a hybrid partition of the receiver's own
  environment (:class:`~creditflow.spark._spool.Spool`), spilling what does not fit; the job
  finishes at Spark's speed, and with replay the stream can be read again.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

import pyarrow as pa

import creditflow as cf
from creditflow.metrics import SpillMetrics
from creditflow.spark._intake import POLL, Intake
from creditflow.spark._spool import Spool


class _Failed:
    """A queued failure: raised by the consumer's thread when it reaches it."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


_END = object()


class Direct:
    """Batches through a queue of at most ``max_queued``: the tasks wait for the consumer."""

    confirm = False

    def __init__(self, env: cf.NetworkEnvironment, *, host: str, secret: str, max_queued: int) -> None:
        self._queue: queue.Queue[object] = queue.Queue(maxsize=max_queued)
        #: Set once the stream failed: the consumer takes nothing after the failure.
        self._failed = threading.Event()
        self.intake = Intake(env, self, host=host, secret=secret)

    def _put(self, item: object, unless: threading.Event | None = None) -> bool:
        """Queues ``item``, waiting while the queue is full; False if the receiver closed (or
        ``unless`` is set)."""
        while not self.intake.closed.is_set() and not (unless is not None and unless.is_set()):
            try:
                self._queue.put(item, timeout=POLL)
                return True
            except queue.Full:
                continue
        return False

    def deliver(self, batch: pa.RecordBatch) -> bool:
        """Queues ``batch`` for the consumer (waits while the queue is full); False once the
        stream failed, so that the partition's reader stops (and its task is not held up
        until its timeout by a queue nobody empties)."""
        return self._put(batch, unless=self._failed)

    def end(self) -> None:
        """The consumer sees the end after the last batch."""
        self._put(_END)

    def fail(self, error: BaseException) -> None:
        """The consumer raises ``error`` after the batches queued before it."""
        self._failed.set()
        self._put(_Failed(error))

    def failure(self) -> str | None:
        """A queue does not fail by itself."""
        return None

    def next(self, timeout: float | None) -> pa.RecordBatch | None:
        """The next batch; None at the end."""
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            raise cf.TimeoutError(f"no batch within {timeout} s") from None
        if item is _END:
            self._queue.put(_END)  # later calls see the end too
            return None
        if isinstance(item, _Failed):
            self._queue.put(item)
            raise item.error
        assert isinstance(item, pa.RecordBatch)
        return item

    def passes(self, timeout: float | None) -> Iterator[pa.RecordBatch]:
        """The batches until the end."""
        while (batch := self.next(timeout)) is not None:
            yield batch

    def spill_metrics(self) -> SpillMetrics | None:
        """Nothing is stored."""
        return None

    def close(self) -> None:
        """Stops receiving (a reader waiting for room in the queue gives up)."""
        self.intake.close()
        self.intake.join()


class Spooled:
    """Batches into a :class:`Spool`: the tasks never wait (what does not fit spills), and
    with replay every iteration reads the stream from the start, ``epochs`` times."""

    confirm = True

    def __init__(
        self, env: cf.NetworkEnvironment, *, host: str, secret: str, replay: bool, epochs: int
    ) -> None:
        self._spool = Spool(env, replay=replay)
        self._epochs = epochs
        self.intake = Intake(env, self, host=host, secret=secret)

    def deliver(self, batch: pa.RecordBatch) -> bool:
        """Appends ``batch`` to the spool (waits only without replay at ``max_spill``)."""
        self._spool.put(batch)
        return True

    def end(self) -> None:
        """A pass that read everything sees the end."""
        self._spool.end()

    def fail(self, error: BaseException) -> None:
        """A pass raises after the batches before (a no-op once the spool failed or ended)."""
        self._spool.fail(f"{type(error).__name__}: {error}")

    def failure(self) -> str | None:
        """The spool's own first failure (a SpillError), or None."""
        return self._spool.failure

    def next(self, timeout: float | None) -> pa.RecordBatch | None:
        """The current pass's next batch (starting the first pass); None at its end."""
        return self._spool.next(timeout)

    def passes(self, timeout: float | None) -> Iterator[pa.RecordBatch]:
        """The batches until the end; with replay, the whole stream from its first batch,
        ``epochs`` times over."""
        replay = self._spool.replay
        for _ in range(self._epochs if replay else 1):
            if replay:
                self._spool.restart()
            while (batch := self.next(timeout)) is not None:
                yield batch

    def spill_metrics(self) -> SpillMetrics | None:
        """The store's metrics."""
        return self._spool.metrics()

    def close(self) -> None:
        """Stops receiving and drops the stored stream (a reader waiting for room fails)."""
        self.intake.close()
        self._spool.release()  # wakes a reader thread waiting for room
        self.intake.join()
