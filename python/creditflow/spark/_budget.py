"""A rank's rows held outside its environment's pools (the queue of epoch 0, the shuffle
window, the chunks being read) counted within its ``memory``: a reservation of the
environment's memory (:meth:`creditflow.NetworkEnvironment.reserve_memory`) sized for the most
rows the rank holds at once, times the largest average row size seen. The runs' store then
spills down to what is left, so the environment's memory and the held rows together stay
within ``memory``; the batch the trainer holds comes on top.
"""

from __future__ import annotations

import threading

import pyarrow as pa

import creditflow as cf

#: How much a row may grow over the size the reservation was made for before it is made anew.
GROWTH = 1.25


class Budget:
    """Holds room in ``env`` for ``rows`` rows outside its pools, and ``extra`` bytes."""

    def __init__(self, env: cf.NetworkEnvironment, rows: int, name: str, extra: int = 0) -> None:
        self._env = env
        self.rows = rows
        #: Bytes held besides the rows (whatever their size), reserved with them.
        self.extra = extra
        self._name = name
        self._lock = threading.Lock()
        self._reserved: cf.MemoryReservation | None = None
        #: The largest average row size seen (bytes: by the batches' buffers, by what their rows
        #: reference where a reservation depends on it), and the one reserved for.
        self.row_bytes = 0.0
        self._reserved_for = 0.0

    def see(self, batch: pa.RecordBatch) -> None:
        """Notes ``batch``'s rows' size; makes the reservation (anew, when rows grew). Raises
        :class:`creditflow.InsufficientBuffersError` naming the settings when the rows do not
        fit in the environment's memory."""
        rows = batch.num_rows
        if rows == 0:
            return
        # Its buffers' bytes: what its rows take (within a few bytes of padding) unless it is
        # a slice of larger buffers; a fraction of a microsecond where ``nbytes``, which walks
        # the ranges the rows reference, costs 10 µs or more a batch.
        size = batch.get_total_buffer_size() / rows
        with self._lock:
            if size <= self.row_bytes:
                return
            if size > self._reserved_for * GROWTH:
                # A reservation depends on it: count what the rows reference, so that a slice
                # does not ask for its whole buffers' room.
                size = batch.nbytes / rows
                if size <= self.row_bytes:
                    return
            self.row_bytes = size
            if size <= self._reserved_for * GROWTH:
                return
            old, self._reserved = self._reserved, None
            if old is not None:
                old.release()
            want = int(self.rows * size) + self.extra
            try:
                self._reserved = self._env.reserve_memory(want, self._name)
            except cf.InsufficientBuffersError as exc:
                raise cf.InsufficientBuffersError(
                    f"{self._name}: {self.rows} rows of about {size:.0f} bytes and {self.extra} more ({want} "
                    f"bytes: the shuffle window, the queue, the chunks being read and those being dealt "
                    f"across the ranks) do not fit in the receiver's memory: "
                    f"raise memory, or lower shuffle_window or max_queued ({exc})"
                ) from None
            self._reserved_for = size

    @property
    def reserved(self) -> int:
        """Bytes reserved now."""
        with self._lock:
            return self._reserved.nbytes if self._reserved is not None else 0

    def held_bytes(self, rows: int) -> int:
        """What ``rows`` held rows take, by the largest average row size seen."""
        return int(rows * self.row_bytes)

    def release(self) -> None:
        """Gives the reservation back. Idempotent."""
        with self._lock:
            held, self._reserved = self._reserved, None
        if held is not None:
            held.release()
