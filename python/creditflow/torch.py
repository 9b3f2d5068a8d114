"""PyTorch on a rank's :class:`creditflow.spark.Receiver`: an ``IterableDataset`` of dicts of
tensors (``pip install creditflow[torch]``).

::

    rx = cfs.Receiver(rank=rank, world_size=world, batch_size=1024, job=spec)
    data = RankDataset(rx, device="cuda")  # the next batch moves to the GPU while this one trains
    loader = DataLoader(data, batch_size=None)  # the rank's batches are the batches
    for epoch in range(3):
        data.set_epoch(epoch)
        for batch in loader:  # {"column": tensor, ...}
            ...

Numeric columns become 1-D tensors, zero-copy from Arrow where the type allows (DLPack:
integers and floats without nulls); booleans are copied. Fixed-size lists, and lists whose rows
all have one length (what Spark's ``array`` columns arrive as), become 2-D tensors, their
values zero-copy too. Other types (strings, dates, decimals) raise ``ValueError`` naming the
column: cast them in Spark, or pick the columns with ``columns=``. JAX and TensorFlow users take
the receiver's ``pyarrow.RecordBatch`` objects (``batch.column(i).to_numpy()``) directly.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterator, Sequence

import pyarrow as pa
import pyarrow.types as pat
import torch
from torch.utils.data import IterableDataset

from creditflow.spark import Receiver

__all__ = ["RankDataset", "to_tensors"]

_END = object()
#: Seconds between the prefetching thread's looks at whether the trainer stopped.
POLL = 0.2


def _column(name: str, arr: pa.Array) -> torch.Tensor:
    if arr.null_count:
        raise ValueError(f"column {name!r} has {arr.null_count} nulls: fill them in Spark first (fillna)")
    t = arr.type
    if pat.is_boolean(t):
        return torch.from_numpy(arr.to_numpy(zero_copy_only=False))
    if pat.is_integer(t) or pat.is_floating(t):
        return torch.utils.dlpack.from_dlpack(arr)
    if pat.is_fixed_size_list(t) or pat.is_list(t) or pat.is_large_list(t):
        if pat.is_fixed_size_list(t):
            width = t.list_size
        else:
            offsets = arr.offsets.to_numpy()
            lengths = offsets[1:] - offsets[:-1]
            if len(lengths) and (lengths != lengths[0]).any():
                raise ValueError(f"column {name!r}: its lists differ in length; a tensor needs one length")
            width = int(lengths[0]) if len(lengths) else 0
        values = arr.flatten()
        return _column(f"{name}[]", values).reshape(len(arr), width)
    raise ValueError(
        f"column {name!r} is {t}: a tensor needs numbers (cast it in Spark, or leave it out with columns=)"
    )


def to_tensors(batch: pa.RecordBatch, columns: Sequence[str] | None = None) -> dict[str, torch.Tensor]:
    """``{column: tensor}`` for ``batch``'s columns (or ``columns``)."""
    names = list(columns) if columns is not None else batch.schema.names
    missing = [c for c in names if c not in batch.schema.names]
    if missing:
        raise ValueError(f"columns {missing} are not in the batch ({batch.schema.names})")
    return {c: _column(c, batch.column(c)) for c in names}


class RankDataset(IterableDataset[dict[str, torch.Tensor]]):
    """A rank's batches as dicts of tensors; use with ``DataLoader(batch_size=None)``.

    Args:
        receiver: The rank's ``Receiver(rank=..., world_size=..., batch_size=...)``.
        columns: The columns to convert (default: all).
        pin_memory: Copy every batch into page-locked memory (faster copies to a GPU; only
            where CUDA is present, else ignored).
        device: Move every batch to this device (``"cuda"``, ``"cuda:1"``, ``"cpu"``) on a
            background thread, the next batch while the trainer works on this one
            (``non_blocking`` copies on a CUDA stream of their own). None: the batches stay
            where Arrow has them (zero-copy), converted in the caller's thread.

    Iterating continues the receiver's current epoch (a re-created ``DataLoader`` goes on at
    the next batch, also with ``device=``: the batches read ahead go back to the receiver);
    :meth:`set_epoch` starts an epoch. The receiver's ``state_dict()`` counts the batches
    the trainer got, not those read ahead.
    """

    def __init__(
        self,
        receiver: Receiver,
        *,
        columns: Sequence[str] | None = None,
        pin_memory: bool = False,
        device: str | torch.device | None = None,
    ) -> None:
        super().__init__()
        self.receiver = receiver
        self._columns = list(columns) if columns is not None else None
        self._pin = pin_memory and torch.cuda.is_available()
        self._device = torch.device(device) if device is not None else None

    def set_epoch(self, epoch: int) -> None:
        """Starts epoch ``epoch`` (see :meth:`creditflow.spark.Receiver.set_epoch`)."""
        self.receiver.set_epoch(epoch)

    def _convert(self, batch: pa.RecordBatch, stream: object = None) -> dict[str, torch.Tensor]:
        out = to_tensors(batch, self._columns)
        if self._pin:
            out = {k: v.pin_memory() for k, v in out.items()}
        if self._device is not None:
            if stream is not None:
                with torch.cuda.stream(stream):  # type: ignore[arg-type]
                    out = {k: v.to(self._device, non_blocking=True) for k, v in out.items()}
                    stream.synchronize()  # type: ignore[attr-defined]
            else:
                out = {k: v.to(self._device) for k, v in out.items()}
        return out

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        if self._device is None:
            for batch in self.receiver:
                yield self._convert(batch)
            return
        yield from self._prefetched()

    def _prefetched(self) -> Iterator[dict[str, torch.Tensor]]:
        """The batches, each converted and moved while the one before is in use. The
        receiver reads them ahead (:meth:`creditflow.spark.Receiver.read_ahead`): a batch
        counts in its ``state_dict()`` only once this hands it to the trainer, and the ones
        read ahead when the trainer stops go back to the receiver for the next iteration."""
        ready: queue.Queue[object] = queue.Queue(maxsize=1)
        stop = threading.Event()
        cuda = self._device is not None and self._device.type == "cuda"
        rx = self.receiver

        def run() -> None:
            stream = torch.cuda.Stream(self._device) if cuda else None  # type: ignore[no-untyped-call]
            waited = 0.0
            try:
                while not stop.is_set():
                    try:
                        batch = rx.read_ahead(timeout=POLL)
                    except TimeoutError:  # creditflow's is one
                        waited += POLL
                        if rx.timeout is not None and waited >= rx.timeout:
                            raise
                        continue
                    waited = 0.0
                    if batch is None:
                        ready.put(_END)
                        return
                    item = self._convert(batch, stream)
                    while not stop.is_set():
                        try:
                            ready.put(item, timeout=POLL)
                            break
                        except queue.Full:
                            continue
            except BaseException as exc:  # raised in the trainer's thread
                ready.put(exc)

        thread = threading.Thread(target=run, name="creditflow-prefetch", daemon=True)
        thread.start()
        try:
            while True:
                item = ready.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                assert isinstance(item, dict)
                rx.consumed()  # the trainer has it now
                yield item
        finally:
            stop.set()
            while thread.is_alive():  # it may wait to hand over one more
                with contextlib.suppress(queue.Empty):
                    ready.get_nowait()
                thread.join(POLL)
            rx.unread()
