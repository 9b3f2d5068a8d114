"""For the streaming tests (and benches/structured_streaming.py): a consumer of a
``Receiver(continuous=True)`` in a thread, which keeps every batch's ids and every job
boundary, optionally taking its time over each row; and a checkpoint made to replay its last
micro-batch."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np

import creditflow.spark as cfs


class Consumer:
    """Iterates ``rx.items()`` in a thread, keeping the batches' ids and the boundaries."""

    def __init__(self, rx: cfs.Receiver, column: str = "id", seconds_per_row: float = 0.0) -> None:
        self.rx = rx
        self.column = column
        #: A slow consumer: it spends this long on each row it takes.
        self.seconds_per_row = seconds_per_row
        self.rows = 0
        self.ids: list[np.ndarray] = []
        self.done: list[cfs.JobDone] = []
        self.ended = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for item in self.rx.items():
                if isinstance(item, cfs.JobDone):
                    self.done.append(item)
                else:
                    self.ids.append(item.column(self.column).to_numpy())
                    self.rows += item.num_rows
                    if self.seconds_per_row:
                        time.sleep(item.num_rows * self.seconds_per_row)
        except BaseException as exc:  # the test asserts on it
            self.error = exc
        finally:
            self.ended.set()

    def wait_jobs(self, n: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.done) < n:
            assert time.monotonic() < deadline, f"{len(self.done)} of {n} jobs after {timeout} s"
            assert self.error is None, self.error
            time.sleep(0.02)

    def all_ids(self) -> np.ndarray:
        return np.concatenate(self.ids) if self.ids else np.array([], dtype=np.int64)


def forget_last_commit(checkpoint: Path) -> int:
    """Makes the checkpoint look as if the driver died right after the sink committed the last
    micro-batch and before Spark recorded it: removes that commit-log entry, and the offsets of
    a micro-batch started after it (stopped midway), so that the next start runs it again."""

    def ids(folder: str) -> list[int]:
        return sorted(int(p.name) for p in (checkpoint / folder).iterdir() if p.name.isdigit())

    last = ids("commits")[-1]
    for folder, batch in [("offsets", b) for b in ids("offsets") if b > last] + [("commits", last)]:
        for name in (str(batch), f".{batch}.crc"):
            (checkpoint / folder / name).unlink(missing_ok=True)
    return last
