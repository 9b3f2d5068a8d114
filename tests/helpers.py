"""Small shared helpers of the creditflow tests (imported as ``from helpers import ...``;
pytest puts this directory on ``sys.path`` because ``tests/`` is not a package)."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import creditflow as cf

#: Runs a test with in-process hand-off of local batches and with them serialized.
HANDOFF = pytest.mark.parametrize("local_handoff", [True, False], ids=["handoff", "serialized"])

#: How long one blocking call in a test may wait before the test fails instead of hanging.
STEP_TIMEOUT = 20.0


def poll(what: str, check: Callable[[], Any], deadline: float = 60.0, every: float = 0.2) -> Any:
    """Calls ``check`` until it returns something truthy; fails after ``deadline`` seconds
    with ``what`` and the last value."""
    end = time.monotonic() + deadline
    last: Any = None
    while time.monotonic() < end:
        last = check()
        if last:
            return last
        time.sleep(every)
    pytest.fail(f"{what}: not seen within {deadline} s (last: {last!r})")


class CStreamOnly:
    """Exposes only ``__arrow_c_stream__`` (like a third-party Arrow producer)."""

    def __init__(self, data: pa.RecordBatch | pa.Table) -> None:
        self._data = data

    def __arrow_c_stream__(self, requested_schema: object = None) -> object:
        return self._data.__arrow_c_stream__(requested_schema)


class CArrayOnly:
    """Exposes only ``__arrow_c_array__`` (like a third-party Arrow producer)."""

    def __init__(self, batch: pa.RecordBatch) -> None:
        self._batch = batch

    def __arrow_c_array__(self, requested_schema: object = None) -> object:
        return self._batch.__arrow_c_array__(requested_schema)


class Producer(threading.Thread):
    """Runs ``body(writer)`` on a thread and keeps its exception for :meth:`finish`."""

    def __init__(self, body: Callable[[], None]) -> None:
        super().__init__(daemon=True)
        self._body = body
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._body()
        except BaseException as exc:  # reported by finish()
            self.error = exc

    def finish(self, timeout: float = STEP_TIMEOUT) -> None:
        self.join(timeout)
        assert not self.is_alive(), "producer thread still blocked"
        if self.error is not None:
            raise self.error


def write_all(
    partition: cf.ResultPartition,
    items: Iterable[Any],
    partitioner: object = None,
    timeout: float = STEP_TIMEOUT,
) -> Producer:
    """Starts a producer writing ``items`` into ``partition`` then closing it."""

    def body() -> None:
        with cf.RecordWriter(partition, partitioner) as w:  # type: ignore[arg-type]
            for item in items:
                w.write(item, timeout=timeout)

    p = Producer(body)
    p.start()
    return p


def read_all(gate: cf.InputGate, timeout: float = STEP_TIMEOUT) -> list[pa.RecordBatch]:
    """Reads a gate to its end, each read bounded by ``timeout``."""
    out = []
    while (b := gate.next(timeout=timeout)) is not None:
        out.append(b)
    return out


def read_channels(gates: list[cf.InputGate], timeout: float = STEP_TIMEOUT) -> list[list[pa.RecordBatch]]:
    """Reads several single-channel gates to their ends, polling them in turn on this thread
    (so a producer blocked on one channel's memory never deadlocks the test)."""
    out: list[list[pa.RecordBatch]] = [[] for _ in gates]
    open_ = set(range(len(gates)))
    idle = 0.0
    while open_:
        progressed = False
        for i in sorted(open_):
            try:
                b = gates[i].next(timeout=0.01)
            except cf.TimeoutError:
                continue
            progressed = True
            if b is None:
                open_.discard(i)
            else:
                out[i].append(b)
        idle = 0.0 if progressed else idle + 0.01 * len(open_)
        assert idle < timeout, "no channel made progress"
    return out


def exchange(
    items: list[Any],
    *,
    num_subpartitions: int = 1,
    partitioner: object = None,
    per_channel: bool = False,
    **env_kwargs: Any,
) -> Any:
    """Writes ``items`` through a fresh environment and returns what the reader got: one
    list of batches (one gate over all channels), or one list per channel."""
    env_kwargs.setdefault("memory", "4MiB")
    with cf.NetworkEnvironment(**env_kwargs) as env:
        part = env.create_partition("p", num_subpartitions)
        specs = [cf.ChannelSpec(env.address, "p", i) for i in range(num_subpartitions)]
        if per_channel:
            gates = [env.create_input_gate([s]) for s in specs]
        else:
            gate = env.create_input_gate(specs)
        producer = write_all(part, items, partitioner)
        try:
            result = read_channels(gates) if per_channel else read_all(gate)
        except BaseException:
            env.close()  # unblocks the producer
            producer.join(STEP_TIMEOUT)
            raise
        producer.finish()
        return result


def assert_batches_equal(got: list[pa.RecordBatch], want: list[pa.RecordBatch]) -> None:
    """Same number of batches, each equal in values and in schema (with metadata)."""
    assert len(got) == len(want), f"got {len(got)} batches, want {len(want)}"
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert isinstance(g, pa.RecordBatch), type(g)
        assert g.schema.equals(w.schema, check_metadata=True), f"batch {i}: {g.schema} != {w.schema}"
        assert g.num_rows == w.num_rows, f"batch {i}: {g.num_rows} rows, want {w.num_rows}"
        assert g.equals(w), f"batch {i} differs:\n{g.to_pylist()[:5]}\nwant\n{w.to_pylist()[:5]}"


def batch(start: int = 0, n: int = 4) -> pa.RecordBatch:
    """Rows ``start`` .. ``start + n`` of one int64 column ``i``."""
    return pa.record_batch({"i": pa.array(range(start, start + n), pa.int64())})


def big_batch(tag: int, nbytes: int = 256 * 1024) -> pa.RecordBatch:
    """A batch of about ``nbytes`` whose first value is ``tag``."""
    v = np.full(nbytes // 8, tag, dtype=np.int64)
    return pa.record_batch({"i": pa.array(v)})


def spec(env: cf.NetworkEnvironment, pid: str, sub: int = 0) -> cf.ChannelSpec:
    """The channel from subpartition ``sub`` of partition ``pid`` in ``env``."""
    return cf.ChannelSpec(env.address, pid, sub)


def fill_until_timeout(w: cf.RecordWriter, make, limit: int = 200) -> list[pa.RecordBatch]:
    """Writes ``make(i)`` until a write times out; returns what was written."""
    written = []
    for i in range(limit):
        b = make(i)
        try:
            w.write(b, timeout=0.2)
        except cf.TimeoutError:
            return written
        written.append(b)
    raise AssertionError(f"{limit} writes never blocked: the pool is not bounded")


# ----------------------------------------------------------------------------------- web


def get(url: str, headers: Mapping[str, str] | None = None) -> tuple[int, bytes, dict[str, str]]:
    """GETs ``url``: the status, the body and the headers (an HTTP error's too)."""
    req = urllib.request.Request(url, headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read(), dict(resp.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


def get_json(url: str) -> Any:
    """GETs ``url``, which must answer 200, and parses its JSON."""
    status, body, _ = get(url)
    assert status == 200, body
    return json.loads(body)


def by_id(p: Any) -> dict[str, Any]:
    """A pipeline graph's (``creditflow.tools.pipeline.Pipeline``) nodes by id."""
    return {n.id: n for n in p.nodes}
