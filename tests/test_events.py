"""In-band events and checkpoint barriers through the Python API, local and remote.

Every batch carries its write stamp ``t`` in column ``t``, every event its stamp as payload,
so the tests can check order and exactly-once delivery. "remote" uses a second environment
in this process, over loopback TCP.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TypeAlias

import pyarrow as pa
import pytest

import creditflow as cf

TIMEOUT = 60.0

Pair: TypeAlias = tuple[cf.NetworkEnvironment, cf.NetworkEnvironment]


def batch(t: int, rows: int = 100) -> pa.RecordBatch:
    """A batch whose every row holds stamp ``t``."""
    return pa.record_batch({"t": pa.array([t] * rows, pa.int64())})


def stamp(b: pa.RecordBatch) -> int:
    """The stamp of a batch made by :func:`batch`."""
    value = b.column("t")[0].as_py()
    assert isinstance(value, int)
    return value


@pytest.fixture(params=["handoff", "serialized", "remote"])
def pair(request: pytest.FixtureRequest) -> Iterator[Pair]:
    """(producer, consumer) environments: the same one locally, two over TCP."""
    mode = request.param
    producer = cf.NetworkEnvironment(memory="8MiB", local_handoff=mode == "handoff")
    consumer = cf.NetworkEnvironment(memory="8MiB") if mode == "remote" else producer
    yield producer, consumer
    consumer.close()
    producer.close()


def open_exchange(pair: Pair, subs: int) -> tuple[cf.RecordWriter, cf.InputGate]:
    producer, consumer = pair
    part = producer.create_partition("p", num_subpartitions=subs)
    gate = consumer.create_input_gate([cf.ChannelSpec(producer.address, "p", i) for i in range(subs)])
    return cf.RecordWriter(part, cf.RoundRobinPartitioner(), timeout=TIMEOUT), gate


def test_events_keep_their_order_with_batches(pair: Pair) -> None:
    subs = 3
    writer, gate = open_exchange(pair, subs)
    expected: list[list[tuple[str, int]]] = [[] for _ in range(subs)]

    def produce() -> None:
        rr = 0
        with writer:
            for t in range(40):
                if t % 4 == 0:
                    writer.broadcast_event(t.to_bytes(8, "little"))
                    for e in expected:
                        e.append(("e", t))
                elif t % 7 == 0:
                    writer.emit_event(t.to_bytes(8, "little"), t % subs)
                    expected[t % subs].append(("e", t))
                else:
                    writer.write(batch(t))
                    expected[rr].append(("b", t))
                    rr = (rr + 1) % subs

    th = threading.Thread(target=produce)
    th.start()
    got: list[list[tuple[str, int]]] = [[] for _ in range(subs)]
    for item in gate.items(timeout=TIMEOUT):
        if isinstance(item, cf.Batch):
            assert item.in_flight == []
            got[item.channel].append(("b", stamp(item.batch)))
        elif isinstance(item, cf.Event):
            got[item.channel].append(("e", int.from_bytes(item.payload, "little")))
        else:
            pytest.fail(f"unexpected {item!r}")
    th.join()
    assert got == expected


def test_plain_iterator_skips_events_and_barriers(pair: Pair) -> None:
    writer, gate = open_exchange(pair, 2)

    def produce() -> None:
        with writer:
            for t in range(30):
                if t % 10 == 5:
                    writer.broadcast_barrier(t)
                writer.broadcast_event(b"x")
                writer.write(batch(t))

    th = threading.Thread(target=produce)
    th.start()
    got = sorted(stamp(b) for b in gate)
    th.join()
    assert got == list(range(30))


def test_aligned_barriers_remote_four_channels() -> None:
    """A consumer slower than the producer; each barrier once, after exactly the batches
    written before it."""
    with cf.NetworkEnvironment(memory="4MiB") as producer, cf.NetworkEnvironment(memory="4MiB") as consumer:
        writer, gate = open_exchange((producer, consumer), 4)
        every, total = 25, 150

        def produce() -> None:
            with writer:
                for t in range(total):
                    if t and t % every == 0:
                        writer.broadcast_barrier(t // every)
                    writer.write(batch(t, 2000))

        th = threading.Thread(target=produce)
        th.start()
        epoch, seen = 0, []
        for item in gate.items(timeout=TIMEOUT):
            if isinstance(item, cf.Barrier):
                assert item == cf.Barrier(epoch + 1)
                epoch = item.checkpoint_id
            else:
                assert isinstance(item, cf.Batch)
                t = stamp(item.batch)
                assert t // every == epoch, f"batch {t} after barrier {epoch}"
                seen.append(t)
        th.join()
        assert sorted(seen) == list(range(total))
        assert epoch == (total - 1) // every
        assert gate.metrics()["stale_barriers"] == 0


def test_unaligned_barrier_reports_what_it_overtook() -> None:
    with cf.NetworkEnvironment(memory="8MiB") as env:
        part = env.create_partition("u", num_subpartitions=2)
        gate = env.create_input_gate([cf.ChannelSpec(env.address, "u", i) for i in range(2)])
        writer = cf.RecordWriter(part, cf.RoundRobinPartitioner())
        for t in range(10):
            writer.write(batch(t))
        assert writer.broadcast_barrier(3, unaligned=True) == [5, 5]
        for t in range(10, 14):
            writer.write(batch(t))
        writer.close()
        items = list(gate.items(timeout=TIMEOUT))
        assert items[0] == cf.Barrier(3, unaligned=True)
        rest = items[1:]
        assert all(isinstance(i, cf.Batch) for i in rest)
        flagged = {stamp(i.batch): i.in_flight for i in rest if isinstance(i, cf.Batch)}
        assert flagged == {t: ([3] if t < 10 else []) for t in range(14)}


def test_bad_events_and_barriers_are_refused() -> None:
    with cf.NetworkEnvironment(memory="4MiB") as env:
        part = env.create_partition("x", num_subpartitions=2)
        writer = cf.RecordWriter(part)
        writer.broadcast_event(b"\0" * 16384)
        with pytest.raises(ValueError, match="at most 16384 bytes"):
            writer.broadcast_event(b"\0" * 16385)
        with pytest.raises(cf.InvalidArgumentError, match="out of range|subpartition"):
            writer.emit_event(b"", 2)
        writer.broadcast_barrier(2)
        with pytest.raises(ValueError, match="must increase"):
            writer.broadcast_barrier(2, unaligned=True)
        with pytest.raises(OverflowError):
            writer.broadcast_barrier(-1)


def test_item_classes() -> None:
    b = pa.record_batch({"t": [1, 2]})
    item = cf.Batch(1, b, [4])
    assert (item.channel, item.batch, item.in_flight) == (1, b, [4])
    assert repr(item) == "Batch(channel=1, rows=2, in_flight=[4])"
    assert cf.Event(0, b"hi") == cf.Event(0, b"hi") != cf.Event(1, b"hi")
    assert repr(cf.Event(0, b"hi")) == "Event(channel=0, payload=b'hi')"
    assert repr(cf.Barrier(5, unaligned=True)) == "Barrier(checkpoint_id=5, unaligned=True)"
    assert cf.Barrier(5) != cf.Barrier(5, True)
    assert cf.CheckpointAborted(2) == cf.CheckpointAborted(2)
    assert repr(cf.CheckpointAborted(2)) == "CheckpointAborted(checkpoint_id=2)"


def read_until_quiet(gate: cf.InputGate) -> list[cf.GateItem]:
    """Items until none comes for 0.3 s (the gate is blocked or idle)."""
    items: list[cf.GateItem] = []
    while True:
        try:
            item = gate.next_item(timeout=0.3)
        except cf.TimeoutError:
            return items
        assert item is not None
        items.append(item)


def test_abort_surfaces_in_python() -> None:
    """Channel a aligns 1; b skips 1 and sends 2: CheckpointAborted(1), then Barrier(2)."""
    with cf.NetworkEnvironment(memory="4MiB") as env:
        a = cf.RecordWriter(env.create_partition("a"), cf.ForwardPartitioner())
        b = cf.RecordWriter(env.create_partition("b"), cf.ForwardPartitioner())
        gate = env.create_input_gate([cf.ChannelSpec(env.address, p, 0) for p in ("a", "b")])
        a.write(batch(0))
        a.broadcast_barrier(1)
        a.write(batch(1))
        a.broadcast_barrier(2)
        a.close()
        items = read_until_quiet(gate)
        # a is blocked at barrier 1: its batch 1 has not come out.
        assert [stamp(i.batch) for i in items if isinstance(i, cf.Batch)] == [0]
        b.write(batch(10))
        b.broadcast_barrier(2)
        b.close()
        items.extend(gate.items(timeout=TIMEOUT))
        kinds = [i for i in items if not isinstance(i, cf.Batch)]
        assert kinds == [cf.CheckpointAborted(1), cf.Barrier(2)]
        assert sorted(stamp(i.batch) for i in items if isinstance(i, cf.Batch)) == [0, 1, 10]
        assert gate.metrics()["stale_barriers"] == 0
