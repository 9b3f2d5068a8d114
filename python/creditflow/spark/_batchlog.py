"""The last complete micro-batch of each stream a continuous receiver serves, kept in memory
and, when asked, in a small JSON file beside the receiver's spill, so that a restarted consumer
still drops a micro-batch that Spark replays.

A stream is one streaming query (its id, which survives restarts from a checkpoint): batch ids
count from 0 in each query, so the ids of two queries never compare. The file is replaced
atomically (written beside, flushed to disk, renamed over the old one): a consumer that dies
while writing it leaves the previous version.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

#: The file's format version.
VERSION = 1


class BatchLog:
    """The last complete batch id of every stream; saved to ``path`` on every change when
    given (loaded from it at start when it exists)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._last: dict[str, int] = {}
        if path is not None and path.exists():
            self._last = _load(path)

    def last(self, stream: str) -> int | None:
        """The last complete batch id of ``stream``, or None."""
        with self._lock:
            return self._last.get(stream)

    def seen(self, stream: str, batch_id: int) -> bool:
        """Whether ``batch_id`` of ``stream`` is complete already (a replay)."""
        last = self.last(stream)
        return last is not None and batch_id <= last

    def complete(self, stream: str, batch_id: int) -> None:
        """Records that ``batch_id`` of ``stream`` is complete (ids only grow)."""
        with self._lock:
            if self._last.get(stream, -1) >= batch_id:
                return
            self._last[stream] = batch_id
            snapshot = dict(self._last)
            if self.path is not None:
                _save(self.path, snapshot)

    def snapshot(self) -> dict[str, int]:
        """Every stream's last complete batch id."""
        with self._lock:
            return dict(self._last)


def _load(path: Path) -> dict[str, int]:
    try:
        doc = json.loads(path.read_text())
        streams = doc["streams"]
        if doc.get("version") != VERSION or not isinstance(streams, dict):
            raise ValueError(f"version {doc.get('version')!r}")
        return {str(k): int(v) for k, v in streams.items()}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(
            f"cannot read the receiver's batch log {path}: {type(exc).__name__}: {exc} "
            "(remove it to start without one: replays of earlier micro-batches are then delivered again)"
        ) from exc


def _save(path: Path, streams: dict[str, int]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump({"version": VERSION, "streams": streams}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
