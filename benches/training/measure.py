"""What the training benchmark measures, and how (Linux ``/proc``; standard library only).

* :class:`Timeline` (in a rank): when the first batch came, when each epoch ended, batches,
  rows and the sum of row keys per epoch.
* :func:`peak_rss` (in a rank): the process's peak resident set (``VmHWM``).
* :class:`Sampler` (in the driver): every ``interval`` seconds, the ``write_bytes`` and CPU
  ticks of a process tree (the driver, its JVM and Spark's Python workers; the ranks, which
  report their own, left out), and the allocated size of a directory. ``write_bytes`` is what a process caused
  to be sent to the storage layer (counted when it dirties page cache, so a file written and
  deleted before write-back counts too; ``cancelled_write_bytes`` says how much of it was
  never written back). A process seen at the start counts from there; one born later counts
  from zero; one that exits counts up to its last sample (Linux keeps no counters of dead
  children), so the interval bounds what a short-lived process can hide.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class Counters:
    """One process's cumulative counters."""

    write_bytes: int = 0
    cancelled_write_bytes: int = 0
    cpu_seconds: float = 0.0
    name: str = ""


def read_counters(pid: int) -> Counters | None:
    """The process's I/O and CPU counters; None if it is gone (or not ours to read)."""
    try:
        io = Path(f"/proc/{pid}/io").read_text()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = dict(line.split(": ", 1) for line in io.splitlines() if ": " in line)
    name, _, rest = stat.partition(" (")[2].rpartition(")")
    ticks = rest.split()[11:13]  # utime, stime
    return Counters(
        name=name,
        write_bytes=int(fields.get("write_bytes", 0)),
        cancelled_write_bytes=int(fields.get("cancelled_write_bytes", 0)),
        cpu_seconds=sum(int(t) for t in ticks) / _TICK,
    )


def descendants(root: int) -> list[int]:
    """``root`` and every process below it, from ``/proc/*/stat`` parent links."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fields = Path(f"/proc/{name}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def dir_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes allocated on disk under ``path`` (``st_blocks``; files vanishing meanwhile are
    skipped)."""
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except OSError:
                continue
    return total


def peak_rss() -> int:
    """This process's peak resident set in bytes (``VmHWM``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


@dataclass
class Usage:
    """What a :class:`Sampler` saw between start and stop."""

    write_bytes: int
    cancelled_write_bytes: int
    cpu_seconds: float
    peak_dir_bytes: int
    processes: int
    #: The processes that wrote most: (pid and name, bytes), largest first.
    writers: list[tuple[str, int]]


@dataclass
class Sampler:
    """Samples a process tree and a directory in a thread until :meth:`stop`."""

    root: int
    directory: Path
    interval: float = 0.2
    #: Pids in the tree not counted (they report their own counters); their children are.
    exclude: list[int] = field(default_factory=list)
    _first: dict[int, Counters] = field(default_factory=dict)
    _last: dict[int, Counters] = field(default_factory=dict)
    _peak_dir: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Sampler:
        for pid in self._pids():
            c = read_counters(pid)
            if c is not None:
                self._first[pid] = self._last[pid] = c
        self._peak_dir = dir_bytes(self.directory)
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)
        self._thread.start()
        return self

    def _pids(self) -> list[int]:
        return [p for p in descendants(self.root) if p not in self.exclude]

    def sample(self) -> None:
        """One sample (the thread takes one every ``interval``)."""
        for pid in self._pids():
            c = read_counters(pid)
            if c is not None:
                self._last[pid] = c
        self._peak_dir = max(self._peak_dir, dir_bytes(self.directory))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def stop(self) -> Usage:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()
        zero = Counters()
        deltas = [(c, self._first.get(pid, zero)) for pid, c in self._last.items()]
        written = [
            (f"{pid} {c.name}", c.write_bytes - self._first.get(pid, zero).write_bytes)
            for pid, c in self._last.items()
        ]
        return Usage(
            write_bytes=sum(c.write_bytes - f.write_bytes for c, f in deltas),
            cancelled_write_bytes=sum(c.cancelled_write_bytes - f.cancelled_write_bytes for c, f in deltas),
            cpu_seconds=sum(c.cpu_seconds - f.cpu_seconds for c, f in deltas),
            peak_dir_bytes=self._peak_dir,
            processes=len(self._last),
            writers=sorted(((w, b) for w, b in written if b), key=lambda x: -x[1])[:5],
        )


@dataclass
class Timeline:
    """A rank's view of one run, in ``time.monotonic()`` seconds (one clock for every process
    on the machine)."""

    first_batch: float | None = None
    epoch_ends: list[float] = field(default_factory=list)
    batches: list[int] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    keys: list[int] = field(default_factory=list)

    def batch(self, rows: int, key_sum: int) -> None:
        """One batch of ``rows`` rows whose row keys sum to ``key_sum``."""
        if self.first_batch is None:
            self.first_batch = time.monotonic()
        if len(self.batches) == len(self.epoch_ends):  # the first batch of an epoch
            self.batches.append(0)
            self.rows.append(0)
            self.keys.append(0)
        self.batches[-1] += 1
        self.rows[-1] += rows
        self.keys[-1] += key_sum

    def end_epoch(self) -> None:
        if len(self.batches) == len(self.epoch_ends):  # an empty epoch
            self.batches.append(0)
            self.rows.append(0)
            self.keys.append(0)
        self.epoch_ends.append(time.monotonic())

    def as_dict(self) -> dict[str, Any]:
        return {
            "first_batch": self.first_batch,
            "epoch_ends": self.epoch_ends,
            "batches": self.batches,
            "rows": self.rows,
            "keys": self.keys,
        }
