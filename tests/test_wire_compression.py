"""``wire_compression``: Arrow IPC body compression (LZ4 frame, ZSTD) of what an environment
serializes for its readers. Batches arrive equal, between two environments over TCP (in this
process, and from a producer process), through a local serialized reader, and the bytes sent
over the connection shrink for compressible data.
"""

from __future__ import annotations

import threading
from typing import Any

import pyarrow as pa
import pytest

import creditflow as cf
from helpers import STEP_TIMEOUT, assert_batches_equal, exchange, read_all
from remote_worker import Worker, type_batch

ROWS = 2_000
COUNT = 8
CODECS = ["lz4", "zstd"]


def batches() -> list[pa.RecordBatch]:
    """The ``types`` data: strings, nulls, nested lists of structs, a dictionary, decimals."""
    return [type_batch(i, ROWS) for i in range(COUNT)]


def send(wire_compression: str | None, *, local_handoff: bool) -> tuple[list[pa.RecordBatch], int]:
    """Sends :func:`batches` from one environment to a gate in another; returns what arrived
    and the bytes the producer sent over the connection for it."""
    want = batches()
    with (
        cf.NetworkEnvironment(
            memory="16MiB", wire_compression=wire_compression, local_handoff=local_handoff
        ) as prod,
        cf.NetworkEnvironment(memory="16MiB") as cons,
    ):
        part = prod.create_partition("p", 1)
        gate = cons.create_input_gate([cf.ChannelSpec(prod.address, "p", 0)])
        w = cf.RecordWriter(part)

        def write() -> None:
            for b in want:
                w.write(b, timeout=STEP_TIMEOUT)

        writer = threading.Thread(target=write)
        writer.start()
        got = [gate.next(timeout=STEP_TIMEOUT) for _ in want]
        writer.join(STEP_TIMEOUT)
        assert not writer.is_alive()
        # Every batch arrived, so all of it was sent; read before the end releases the partition.
        remote = prod.metrics()["partitions"]["p"]["subpartitions"][0]["remote"]
        assert remote is not None
        sent = remote["bytes_sent"]
        w.close()
        assert gate.next(timeout=STEP_TIMEOUT) is None
    return [b for b in got if b is not None], sent


@pytest.mark.parametrize("local_handoff", [True, False], ids=["handoff", "serialized"])
@pytest.mark.parametrize("codec", CODECS)
def test_round_trip_between_environments_is_equal_and_sends_fewer_bytes(
    codec: str, local_handoff: bool
) -> None:
    plain, plain_sent = send(None, local_handoff=local_handoff)
    got, sent = send(codec, local_handoff=local_handoff)
    assert_batches_equal(plain, batches())
    assert_batches_equal(got, batches())
    assert 0 < sent < plain_sent, f"{codec}: {sent} bytes sent, uncompressed {plain_sent}"


@pytest.mark.parametrize("codec", CODECS)
def test_round_trip_from_a_producer_process(workers: list[Worker], codec: str) -> None:
    spec: dict[str, Any] = {
        "id": "p",
        "subpartitions": 1,
        "partitioner": "forward",
        "data": "types",
        "count": COUNT,
        "rows": ROWS,
    }
    workers.append(
        p := Worker("producer", env={"memory": "16MiB", "wire_compression": codec}, partitions=[spec])
    )
    addr = p.wait_for("address")["address"]
    with cf.NetworkEnvironment(memory="16MiB") as env:
        got = read_all(env.create_input_gate([cf.ChannelSpec(addr, "p", 0)]))
    assert_batches_equal(got, batches())
    assert p.wait_for("finished")["batches"] == COUNT


@pytest.mark.parametrize("codec", CODECS)
def test_a_local_serialized_reader_gets_the_batches(codec: str) -> None:
    got = exchange(batches(), local_handoff=False, wire_compression=codec, memory="16MiB")
    assert_batches_equal(got, batches())


@pytest.mark.parametrize("bad", ["gzip", "LZ4", ""])
def test_an_unknown_codec_is_a_value_error_naming_the_choices(bad: str) -> None:
    with pytest.raises(ValueError, match=r'wire_compression must be None, "lz4" or "zstd"'):
        cf.NetworkEnvironment(wire_compression=bad)
