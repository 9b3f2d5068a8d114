"""A host service for the tests: its name, a numbered batch, ``creditflow serve`` in a
process of its own."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pyarrow as pa


def name_for(what: str) -> str:
    """A service name of its own for ``what`` (a name per test and run)."""
    return f"test-{what}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def numbered_batch(first: int, rows: int) -> pa.RecordBatch:
    """``k`` = first .. first + rows - 1 and ``v`` its number as a string."""
    return pa.record_batch(
        {"k": pa.array(range(first, first + rows), pa.int64()), "v": [str(i) for i in range(rows)]}
    )


@contextlib.contextmanager
def serving(name: str, *options: str) -> Iterator[subprocess.Popen[str]]:
    """``creditflow serve NAME OPTIONS...`` in a process of its own, listening; stopped with
    SIGTERM."""
    with subprocess.Popen(
        [sys.executable, "-m", "creditflow", "serve", name, *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as proc:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        try:
            assert f"creditflow host service {name!r} at" in line, line
            yield proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=30)
