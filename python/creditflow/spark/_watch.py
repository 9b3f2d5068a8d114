"""Whether the receivers a sending task registered with still run, while their readers have
not reached its partition.

A receiver that goes away after it accepted a partition but before its reader connected
leaves nothing to break: the task's writes and its wait for the readers would hold it until
its ``timeout`` (600 s by default). Once a reader is connected, its connection breaks when
the receiver goes (at once, or within ``peer_timeout`` for a vanished host), so a receiver is
asked only while its subpartition has no reader, once every :data:`WATCH_EVERY` seconds. The
asks keep the data connections' rule: a receiver that refuses or drops the connection is gone
at once, one that has not answered for ``peer_timeout`` seconds (a vanished host, a cut link:
the asks time out) is gone then.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import TYPE_CHECKING

import pyarrow as pa

import creditflow as cf
from creditflow.spark import _messages

if TYPE_CHECKING:
    from typing_extensions import Self

#: Seconds between two looks at a partition whose readers have not all connected.
WATCH_EVERY = 1.0


class ReaderWatch:
    """Watches ``part``'s subpartitions (subpartition r goes to the receiver at
    ``addresses[r]``) on a thread of its own until each has its reader. A receiver that
    refuses or drops the connection before its reader came, or has not answered for
    ``patience`` seconds (the task's ``peer_timeout``), is gone: the watch releases the
    partition, which wakes the task's blocked write or wait, and the task raises
    ``ConnectionError`` naming it (``who(r)``) as it leaves the ``with`` block or takes its
    next batch through :meth:`guard`."""

    def __init__(
        self,
        part: cf.ResultPartition,
        addresses: tuple[str, ...],
        secret: str,
        who: Callable[[int], str],
        patience: float,
        every: float = WATCH_EVERY,
    ) -> None:
        self.gone: str | None = None
        self._part = part
        self._addresses = addresses
        self._secret = secret
        self._who = who
        self._patience = patience
        self._every = every
        # When each receiver last answered (it had just accepted the partition).
        self._answered = [time.monotonic()] * len(addresses)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="creditflow-send-watch", daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # Not joined: an ask in flight may take up to its patience (a busy or vanished
        # receiver), and the task must not wait for it. Once stopped, the thread releases nothing.
        self._stop.set()
        if self.gone is not None:
            raise ConnectionError(self.gone) from exc

    def guard(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """``batches``, until a receiver is found gone (a released partition's writes may
        not fail by themselves: the task stops computing its input here)."""
        for batch in batches:
            if self.gone is not None:
                raise ConnectionError(self.gone)
            yield batch

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            try:
                subpartitions = self._part.metrics()["subpartitions"]
            except cf.CreditflowError:
                return  # released: the task is done with it
            waiting = [s["index"] for s in subpartitions if not s["consumed"]]
            if not waiting:
                return
            for r in waiting:
                why = self._ask(r)
                if self._stop.is_set():
                    return
                if why is not None:
                    self.gone = f"{self._who(r)} went away before its reader reached this task: {why}"
                    self._part.release()
                    return

    def _ask(self, r: int) -> str | None:
        """Why the receiver at ``addresses[r]`` is gone, or None while it answers (or has not
        answered for less than the patience: a busy receiver is not taken for gone)."""
        try:
            alive = {"kind": _messages.ALIVE}
            _messages.request(self._addresses[r], self._secret, alive, timeout=self._patience)
        except TimeoutError as exc:
            silent = time.monotonic() - self._answered[r]
            if silent < self._patience:
                return None
            return f"it has not answered for {silent:.1f} s (peer_timeout={self._patience:g} s; {exc})"
        except (OSError, EOFError, multiprocessing.AuthenticationError) as exc:
            return f"{type(exc).__name__}: {exc}"
        self._answered[r] = time.monotonic()
        return None
