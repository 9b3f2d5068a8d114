"""The TCP transport between two real processes: every batch exactly once and in order.

The producer runs in a worker process (``tests/remote_worker.py``), the consumer in the test
process; both environments talk over 127.0.0.1 only.
"""

from __future__ import annotations

import time
from typing import Any

import pyarrow as pa
import pytest

import creditflow as cf
from helpers import assert_batches_equal, exchange, read_all
from remote_worker import Config, Worker, type_batch, wait_all_segments_free

ROWS = 2_000  # per "types" batch: about 190 KB of Arrow data, several 32 KiB segments
COUNT = 24
SECRET = "correct horse battery staple"


def start_producer(env: Config | None = None, **partition: Any) -> Worker:
    """A producer worker with one partition ``p`` (``partition`` overrides the defaults)."""
    spec = {
        "id": "p",
        "subpartitions": 4,
        "partitioner": "hash:k",
        "data": "types",
        "count": COUNT,
        "rows": ROWS,
        **partition,
    }
    return Worker("producer", env={"memory": "16MiB", **(env or {})}, partitions=[spec])


def expected_per_channel() -> list[list[pa.RecordBatch]]:
    """What each of the 4 hash channels must get: the same batches through a local exchange."""
    batches = [type_batch(i, ROWS) for i in range(COUNT)]
    got: list[list[pa.RecordBatch]] = exchange(
        batches, num_subpartitions=4, partitioner=cf.HashPartitioner(["k"]), per_channel=True, memory="16MiB"
    )
    return got


def split_by_channel(
    got: list[pa.RecordBatch], want: list[list[pa.RecordBatch]]
) -> list[list[pa.RecordBatch]]:
    """Sorts batches read through one gate back into their channels (by their first row
    number; every piece of a hash-split batch has rows, so a first row)."""
    channel_of = {b.column("row")[0].as_py(): c for c, bs in enumerate(want) for b in bs}
    out: list[list[pa.RecordBatch]] = [[] for _ in want]
    for b in got:
        assert b.num_rows > 0, "an empty batch came through"
        out[channel_of[b.column("row")[0].as_py()]].append(b)
    return out


@pytest.mark.parametrize(
    ("producer_env", "consumer_env"),
    [
        ({}, {}),
        ({"local_handoff": False}, {}),
        ({"flow_control": "tcp"}, {"flow_control": "tcp"}),
        # No exclusive buffers: every buffer is a floating one, assigned from the backlog the
        # producer announces (Flink's exclusive=0 mode).
        ({}, {"exclusive_buffers": 0, "floating_buffers": 4}),
    ],
    ids=["credit-handoff", "credit-serialized", "tcp", "credit-exclusive-0"],
)
def test_hash_exchange_exactly_once_in_order_and_memory_returns(
    workers: list[Worker], producer_env: Config, consumer_env: Config
) -> None:
    want = expected_per_channel()
    workers.append(p := start_producer(producer_env))
    addr = p.wait_for("address")["address"]
    with cf.NetworkEnvironment(memory="16MiB", **consumer_env) as env:
        gate = env.create_input_gate([cf.ChannelSpec(addr, "p", i) for i in range(4)])
        (g,) = env.metrics()["gates"].values()
        assert g["remote"] is not None
        assert g["remote"]["remote_channels"] == 4
        assert g["remote"]["exclusive_total"] == 4 * consumer_env.get("exclusive_buffers", 2)
        got = read_all(gate)
        for c, (g, w) in enumerate(zip(split_by_channel(got, want), want, strict=True)):
            assert len(g) == COUNT, f"channel {c}"
            assert_batches_equal(g, w)
        assert p.wait_for("finished")["batches"] == COUNT
        gate.close()
        wait_all_segments_free(env.metrics, "consumer")

    def producer_metrics() -> Any:
        p.send(cmd="metrics")
        return p.wait_for("metrics")["metrics"]

    wait_all_segments_free(producer_metrics, "producer")
    p.send(cmd="exit")
    p.wait()


def test_partition_registered_later_is_served(workers: list[Worker]) -> None:
    workers.append(p := start_producer(delay=1.0, subpartitions=1, partitioner="forward", count=3))
    addr = p.wait_for("address")["address"]
    with cf.NetworkEnvironment(request_backoff_initial=0.1, request_backoff_max=2.0) as env:
        gate = env.create_input_gate([cf.ChannelSpec(addr, "p", 0)])
        t0 = time.monotonic()
        got = read_all(gate)
        assert time.monotonic() - t0 > 0.9, "read before the partition existed"
        assert_batches_equal(got, [type_batch(i, ROWS) for i in range(3)])


def test_partition_never_registered_raises_after_the_backoff(workers: list[Worker]) -> None:
    workers.append(p := start_producer(delay=60.0))
    addr = p.wait_for("address")["address"]
    with cf.NetworkEnvironment(request_backoff_initial=0.05, request_backoff_max=0.2) as env:
        gate = env.create_input_gate([cf.ChannelSpec(addr, "p", 0)])
        t0 = time.monotonic()
        with pytest.raises(cf.PartitionNotFoundError, match='partition "p" not found'):
            gate.next(timeout=10)
        # 0.05 + 0.1 + 0.2 s of retries, plus round trips.
        assert 0.3 < time.monotonic() - t0 < 5


@pytest.mark.parametrize(
    ("producer_secret", "consumer_secret"),
    [(SECRET, "wrong secret"), (SECRET, None), (None, SECRET)],
    ids=["wrong", "consumer-has-none", "producer-has-none"],
)
def test_secret_mismatch_is_an_authentication_error(
    workers: list[Worker], producer_secret: str | None, consumer_secret: str | None
) -> None:
    workers.append(p := start_producer({"secret": producer_secret}))
    addr = p.wait_for("address")["address"]
    with cf.NetworkEnvironment(secret=consumer_secret) as env:
        gate = env.create_input_gate([cf.ChannelSpec(addr, "p", 0)])
        with pytest.raises(cf.AuthenticationError):
            gate.next(timeout=10)


def test_same_secret_works(workers: list[Worker]) -> None:
    workers.append(p := start_producer({"secret": SECRET}, subpartitions=1, partitioner="forward", count=4))
    addr = p.wait_for("address")["address"]
    with cf.NetworkEnvironment(secret=SECRET.encode()) as env:  # bytes and str are the same secret
        got = read_all(env.create_input_gate([cf.ChannelSpec(addr, "p", 0)]))
    assert_batches_equal(got, [type_batch(i, ROWS) for i in range(4)])


def test_wildcard_bind_needs_a_secret_or_insecure() -> None:
    with pytest.raises(ValueError, match="secret|insecure"):
        cf.NetworkEnvironment(bind="0.0.0.0:0")
    with cf.NetworkEnvironment(bind="0.0.0.0:0", secret=SECRET, advertise="127.0.0.1") as env:
        assert env.address.startswith("127.0.0.1:")
    # insecure=True allows it; a second environment reads from it over TCP.
    with (
        cf.NetworkEnvironment(bind="0.0.0.0:0", insecure=True, advertise="127.0.0.1") as server,
        cf.NetworkEnvironment() as client,
    ):
        batches = [type_batch(i, 100) for i in range(3)]
        part = server.create_partition("wild", 1)
        with cf.RecordWriter(part) as w:
            for b in batches:
                w.write(b)
        assert_batches_equal(
            read_all(client.create_input_gate([cf.ChannelSpec(server.address, "wild", 0)])), batches
        )
