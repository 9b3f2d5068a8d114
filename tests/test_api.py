"""The public API around the data path: construction, errors, limits, lifecycle, metrics and
timeouts (Ctrl-C, threads and fork: ``test_process_life.py``)."""

from __future__ import annotations

import builtins
import os
import time

import numpy as np
import pyarrow as pa
import pytest

import creditflow as cf
import creditflow.errors
from creditflow.metrics import EnvMetrics, GateMetrics, PartitionMetrics, PoolStats
from helpers import (
    HANDOFF,
    STEP_TIMEOUT,
    Producer,
    assert_batches_equal,
    batch,
    big_batch,
    read_all,
    spec,
    write_all,
)

SEG = 32 * 1024


# ---------------------------------------------------------------------------------------------
# Memory minimums
# ---------------------------------------------------------------------------------------------


def test_partition_that_cannot_get_its_minimum_fails_at_once() -> None:
    with cf.NetworkEnvironment(memory="128KiB", segment_size="32KiB") as env:
        assert env.total_segments == 4
        t0 = time.monotonic()
        with pytest.raises(cf.InsufficientBuffersError) as info:
            env.create_partition("p", num_subpartitions=4)  # needs 4 + 1
        assert time.monotonic() - t0 < 1.0
        err = info.value
        assert isinstance(err, cf.CreditflowError)
        assert (err.required, err.available, err.total, err.segment_size) == (5, 4, 4, SEG)
        msg = str(err)
        assert "required 5" in msg
        assert "available 4" in msg
        assert "memory" in msg  # the settings to change
        assert "segment_size" in msg
        # Nothing was registered: the same id works once it fits.
        env.create_partition("p", num_subpartitions=3)


def test_minimums_add_up_across_partitions_and_return_on_release() -> None:
    with cf.NetworkEnvironment(memory="128KiB") as env:
        first = env.create_partition("a", 2)  # reserves 3 of 4
        with pytest.raises(cf.InsufficientBuffersError) as info:
            env.create_partition("b", 1)  # needs 2, 1 left
        assert (info.value.required, info.value.available) == (2, 1)
        first.release()
        assert first.released
        env.create_partition("b", 1)


def test_gate_that_cannot_get_its_minimum_fails_at_once() -> None:
    with cf.NetworkEnvironment(memory="128KiB") as env:
        env.create_partition("p", 3)  # reserves all 4 segments
        t0 = time.monotonic()
        with pytest.raises(cf.InsufficientBuffersError) as info:
            env.create_input_gate([spec(env, "p", 0)])
        assert time.monotonic() - t0 < 1.0
        assert info.value.required >= 1
        assert info.value.available == 0
        assert "memory" in str(info.value)


# ---------------------------------------------------------------------------------------------
# parse_bytes and constructor arguments
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("64MiB", 64 << 20),
        ("32 KiB", 32 << 10),
        ("32k", 32 << 10),
        ("32K", 32 << 10),
        ("1.5GiB", 3 << 29),
        ("1g", 1 << 30),
        ("2TiB", 2 << 40),
        ("1MB", 1_000_000),
        ("1 kb", 1000),
        ("1GB", 10**9),
        ("4096", 4096),
        ("4096B", 4096),
        ("  8 MiB  ", 8 << 20),
        ("1_024", 1024),
        ("0", 0),
        (65536, 65536),
        (0, 0),
    ],
)
def test_parse_bytes(text: str | int, value: int) -> None:
    assert cf.parse_bytes(text) == value


@pytest.mark.parametrize("bad", ["", "MiB", "12 parsecs", "-1", "0.5B", "1e3", "1.1B", "lots", -1])
def test_parse_bytes_rejects_garbage_with_value_error(bad: str | int) -> None:
    with pytest.raises(ValueError, match="."):
        cf.parse_bytes(bad)


@pytest.mark.parametrize("bad", [1.5, None, b"64MiB", [1]])
def test_parse_bytes_rejects_other_types_with_type_error(bad: object) -> None:
    with pytest.raises(TypeError):
        cf.parse_bytes(bad)  # type: ignore[arg-type]


def test_sizes_accept_ints_and_strings() -> None:
    with cf.NetworkEnvironment(memory=1 << 20, segment_size="16KiB") as env:
        assert env.segment_size == 16 * 1024
        assert env.total_segments == 64
    with cf.NetworkEnvironment(memory="1MiB", segment_size=8192) as env:
        assert env.segment_size == 8192
        assert env.total_segments == 128
        assert env.metrics()["segments_total"] == 128


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [
        ({"flow_control": "x"}, "flow_control"),
        ({"buffer_timeout": -1}, "buffer_timeout"),
        ({"buffer_timeout": float("nan")}, "buffer_timeout"),
        ({"buffer_timeout": float("inf")}, "buffer_timeout"),
        ({"segment_size": 3000}, "segment_size"),
        ({"segment_size": 48 * 1024}, "segment_size"),
        ({"segment_size": 1024}, "segment_size"),
        ({"memory": "16KiB"}, "segment"),
        ({"memory": 0}, "segment"),
        ({"memory": "lots"}, "memory"),
        ({"memory": -5}, "memory"),
        ({"floating_buffers": 0}, "floating_buffers"),
        ({"request_backoff_initial": 0}, "request_backoff_initial"),
        ({"request_backoff_max": -1}, "request_backoff_max"),
        ({"secret": ""}, "secret"),
        ({"bind": "not an address"}, "bind"),
        ({"handshake_timeout": 0}, "handshake_timeout"),
        ({"debloat_target": 0}, "debloat_target"),
        ({"overdraft_buffers": -1}, "overdraft_buffers"),
        ({"max_channels_per_connection": -1}, "max_channels_per_connection"),
        ({"peer_timeout": float("nan")}, "peer_timeout"),
        ({"max_spill": "lots"}, "max_spill"),
        ({"wire_compression": "gzip"}, "wire_compression"),
    ],
)
@pytest.mark.parametrize("make", ["NetworkEnvironment", "HostService"])
def test_bad_environment_arguments_are_value_errors(kwargs: dict, word: str, make: str) -> None:
    """An environment and a host service (whose settings are an environment's) refuse a bad
    setting alike, naming it."""
    constructor = {
        "NetworkEnvironment": cf.NetworkEnvironment,
        "HostService": lambda **kw: cf.HostService(f"bad-setting-{os.getpid()}", **kw),
    }[make]
    with pytest.raises(ValueError, match=word):
        constructor(**kwargs)


def test_flow_control_modes_are_accepted() -> None:
    for mode in ("credit", "tcp"):
        with cf.NetworkEnvironment(memory="1MiB", flow_control=mode) as env:
            assert not env.closed


def test_non_loopback_bind_needs_a_secret_or_insecure() -> None:
    with pytest.raises(ValueError, match="secret") as info:
        cf.NetworkEnvironment(memory="1MiB", bind="0.0.0.0:0")
    assert "insecure" in str(info.value)
    with cf.NetworkEnvironment(memory="1MiB", bind="0.0.0.0:0", insecure=True) as env:
        assert env.address.rsplit(":", 1)[1] != "0"
    with cf.NetworkEnvironment(memory="1MiB", bind="0.0.0.0:0", secret="s3cret") as env:
        assert not env.closed
    with cf.NetworkEnvironment(memory="1MiB", bind="0.0.0.0:0", secret=b"\x00bytes") as env:
        assert not env.closed


def test_loopback_binds_get_an_ephemeral_port() -> None:
    with cf.NetworkEnvironment(memory="1MiB") as a, cf.NetworkEnvironment(memory="1MiB") as b:
        host, port = a.address.rsplit(":", 1)
        assert host == "127.0.0.1"
        assert int(port) > 0
        assert a.address != b.address
        assert a.metrics()["address"] == a.address


# ---------------------------------------------------------------------------------------------
# Partitions, channels, gates
# ---------------------------------------------------------------------------------------------


def test_duplicate_partition_id_is_a_value_error() -> None:
    with cf.NetworkEnvironment(memory="1MiB") as env:
        p = env.create_partition("job/1/0", 2)
        assert (p.id, p.num_subpartitions, p.schema, p.finished, p.released) == (
            "job/1/0",
            2,
            None,
            False,
            False,
        )
        with pytest.raises(ValueError, match="job/1/0") as info:
            env.create_partition("job/1/0", 1)
        assert isinstance(info.value, cf.InvalidArgumentError)
        p.release()
        assert env.create_partition("job/1/0", 1).num_subpartitions == 1  # the id is free again


@pytest.mark.parametrize(("pid", "n"), [("", 1), ("p", 0)])
def test_bad_partition_arguments(pid: str, n: int) -> None:
    with cf.NetworkEnvironment(memory="1MiB") as env, pytest.raises(ValueError, match="must"):
        env.create_partition(pid, n)


def test_subpartition_out_of_range_is_a_value_error() -> None:
    with cf.NetworkEnvironment(memory="1MiB") as env:
        env.create_partition("p", 4)
        with pytest.raises(ValueError, match="out of range") as info:
            env.create_input_gate([spec(env, "p", 4)])
        assert isinstance(info.value, cf.CreditflowError)
        # The failed gate did not consume anything: every subpartition can still be read.
        gate = env.create_input_gate([spec(env, "p", i) for i in range(4)])
        assert gate.num_channels == 4


def test_reading_a_subpartition_twice_is_already_consumed() -> None:
    with cf.NetworkEnvironment(memory="1MiB") as env:
        env.create_partition("p", 2)
        first = env.create_input_gate([spec(env, "p", 0)])
        with pytest.raises(cf.AlreadyConsumedError) as info:
            env.create_input_gate([spec(env, "p", 0)])
        assert isinstance(info.value, ValueError)
        first.close()
        with pytest.raises(cf.AlreadyConsumedError):  # pipelined: read once, even after close
            env.create_input_gate([spec(env, "p", 0)])
        env.create_input_gate([spec(env, "p", 1)])


def test_bad_gate_arguments() -> None:
    with cf.NetworkEnvironment(memory="1MiB") as env:
        env.create_partition("p", 2)
        with pytest.raises(ValueError, match="at least one channel"):
            env.create_input_gate([])
        with pytest.raises(ValueError, match="twice"):
            env.create_input_gate([spec(env, "p", 0), spec(env, "p", 0)])
        with pytest.raises(TypeError, match="ChannelSpec"):
            env.create_input_gate([("addr", "p", 0)])  # type: ignore[list-item]


def test_partitioner_arguments() -> None:
    assert cf.HashPartitioner("k").keys == ["k"]
    assert cf.HashPartitioner(["a", "b"]).keys == ["a", "b"]
    with pytest.raises(ValueError, match="key"):
        cf.HashPartitioner([])
    with pytest.raises(TypeError):
        cf.HashPartitioner(5)  # type: ignore[arg-type]
    with cf.NetworkEnvironment(memory="1MiB") as env:
        part = env.create_partition("p")
        with pytest.raises(TypeError, match="partitioner"):
            cf.RecordWriter(part, "hash")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="timeout"):
            cf.RecordWriter(part, timeout=-1)


def test_gate_properties_and_end_of_stream() -> None:
    with cf.NetworkEnvironment(memory="1MiB") as env:
        part = env.create_partition("p", 2)
        specs = [spec(env, "p", 1), spec(env, "p", 0)]
        gate = env.create_input_gate(specs)
        assert gate.num_channels == 2
        assert gate.channels == specs
        with cf.RecordWriter(part) as w:
            w.write(batch(0), timeout=STEP_TIMEOUT)
            w.write(batch(4), timeout=STEP_TIMEOUT)
        got = list(gate)
        assert sorted(b.column("i")[0].as_py() for b in got) == [0, 4]
        assert gate.next(timeout=1) is None  # stays at the end
        assert gate.next() is None
        assert list(gate) == []
        assert part.finished


# ---------------------------------------------------------------------------------------------
# Timeouts
# ---------------------------------------------------------------------------------------------


def test_next_with_a_timeout_raises_timeout_error_and_the_gate_keeps_working() -> None:
    with cf.NetworkEnvironment(memory="1MiB") as env:
        part = env.create_partition("p")
        gate = env.create_input_gate([spec(env, "p")])
        t0 = time.monotonic()
        with pytest.raises(cf.TimeoutError) as info:
            gate.next(timeout=0.2)
        elapsed = time.monotonic() - t0
        assert 0.15 <= elapsed < 1.5, elapsed
        assert isinstance(info.value, builtins.TimeoutError)
        assert isinstance(info.value, cf.CreditflowError)
        with pytest.raises(TimeoutError):
            gate.next(timeout=0)
        w = cf.RecordWriter(part)
        w.write(batch(), timeout=STEP_TIMEOUT)
        w.flush()
        assert gate.next(timeout=STEP_TIMEOUT).equals(batch())
        w.close()
        assert gate.next(timeout=STEP_TIMEOUT) is None


def test_negative_next_timeout_is_a_value_error() -> None:
    with cf.NetworkEnvironment(memory="1MiB") as env:
        env.create_partition("p")
        gate = env.create_input_gate([spec(env, "p")])
        with pytest.raises(ValueError, match="timeout"):
            gate.next(timeout=-1)


@HANDOFF
def test_write_timeout_on_a_full_pool_can_be_retried_without_loss_or_duplicates(local_handoff: bool) -> None:
    with cf.NetworkEnvironment(memory="1MiB", local_handoff=local_handoff, buffer_timeout=0) as env:
        part = env.create_partition("p")
        gate = env.create_input_gate([spec(env, "p")])
        w = cf.RecordWriter(part)
        written = []
        for i in range(100):  # write until the pool is full and a write times out
            b = big_batch(i, 100 * 1024)
            t0 = time.monotonic()
            try:
                w.write(b, timeout=0.2)
            except cf.TimeoutError:
                assert 0.15 <= time.monotonic() - t0 < 1.5
                blocked = b
                break
            written.append(b)
        else:
            raise AssertionError("the pool never filled up")
        assert written, "the first write must fit"
        assert part.metrics()["batches_written"] == len(written)
        got: list[pa.RecordBatch] = []
        reader = Producer(lambda: got.extend(read_all(gate)))
        reader.start()
        w.write(blocked, timeout=STEP_TIMEOUT)  # the retry
        w.close()
        reader.finish()
        assert [b.column("i")[0].as_py() for b in got] == list(range(len(written) + 1))
        assert_batches_equal(got, [*written, blocked])


def test_writer_default_timeout_applies_to_write() -> None:
    with cf.NetworkEnvironment(memory="1MiB") as env:
        part = env.create_partition("p")
        gate = env.create_input_gate([spec(env, "p")])  # kept: dropping a gate releases its channels
        w = cf.RecordWriter(part, timeout=0.2)
        t0 = time.monotonic()
        with pytest.raises(cf.TimeoutError):  # noqa: PT012 - writes until the pool is full
            for i in range(100):
                w.write(big_batch(i, 100 * 1024))
        assert time.monotonic() - t0 < 5
        assert gate.metrics()["batches_received"] == 0


def test_backpressure_is_measured_and_levelled() -> None:
    with cf.NetworkEnvironment(memory="1MiB") as env:
        part = env.create_partition("p")
        gate = env.create_input_gate([spec(env, "p")])
        assert part.metrics()["level"] == "OK"
        w = cf.RecordWriter(part)
        with pytest.raises(cf.TimeoutError):  # noqa: PT012 - writes until the pool is full
            for i in range(100):
                w.write(big_batch(i, 100 * 1024), timeout=1.0)
        m = part.metrics()
        assert m["backpressured_ms_per_second"] > 500
        assert m["level"] == "HIGH"
        assert 0.9 <= m["out_pool_usage"] <= 1.0
        gate.close()


# ---------------------------------------------------------------------------------------------
# Late and missing partitions
# ---------------------------------------------------------------------------------------------


@HANDOFF
def test_partition_registered_after_the_gate_is_served(local_handoff: bool) -> None:
    with cf.NetworkEnvironment(
        memory="1MiB", local_handoff=local_handoff, request_backoff_initial=0.05, request_backoff_max=2.0
    ) as env:
        gate = env.create_input_gate([spec(env, "late", 0), spec(env, "late", 1)])
        want = [batch(i * 4) for i in range(6)]

        def body() -> None:
            time.sleep(0.3)
            part = env.create_partition("late", 2)
            with cf.RecordWriter(part, cf.BroadcastPartitioner()) as w:
                for b in want:
                    w.write(b, timeout=STEP_TIMEOUT)

        producer = Producer(body)
        producer.start()
        got = read_all(gate)
        producer.finish()
        assert len(got) == 12
        assert sorted(b.column("i")[0].as_py() for b in got) == sorted(
            [b.column("i")[0].as_py() for b in want] * 2
        )


def test_partition_never_registered_fails_after_the_backoff() -> None:
    with cf.NetworkEnvironment(memory="1MiB", request_backoff_initial=0.05, request_backoff_max=0.2) as env:
        gate = env.create_input_gate([spec(env, "missing/part", 0)])
        t0 = time.monotonic()
        with pytest.raises(cf.PartitionNotFoundError, match="missing/part") as info:
            gate.next(timeout=STEP_TIMEOUT)
        elapsed = time.monotonic() - t0
        assert 0.2 <= elapsed < 3.0, elapsed
        assert isinstance(info.value, LookupError)


def test_partition_not_found_honours_the_next_timeout_first() -> None:
    with cf.NetworkEnvironment(memory="1MiB", request_backoff_initial=0.05, request_backoff_max=5.0) as env:
        gate = env.create_input_gate([spec(env, "missing", 0)])
        with pytest.raises(cf.TimeoutError):
            gate.next(timeout=0.2)


# ---------------------------------------------------------------------------------------------
# Writer lifecycle
# ---------------------------------------------------------------------------------------------


class Boom(Exception):
    pass


@HANDOFF
def test_exception_inside_with_writer_fails_the_readers(local_handoff: bool) -> None:
    with cf.NetworkEnvironment(memory="1MiB", local_handoff=local_handoff) as env:
        part = env.create_partition("p")
        gate = env.create_input_gate([spec(env, "p")])
        before = [batch(0), batch(4), batch(8)]
        with pytest.raises(Boom), cf.RecordWriter(part) as w:  # noqa: PT012 - the user's with-block
            for b in before:
                w.write(b, timeout=STEP_TIMEOUT)
            raise Boom("the user's code broke")
        got = [gate.next(timeout=STEP_TIMEOUT) for _ in before]
        with pytest.raises(cf.ProducerFailedError, match="the user's code broke") as info:
            gate.next(timeout=STEP_TIMEOUT)
        assert isinstance(info.value, cf.CreditflowError)
        assert_batches_equal(got, before)
        with pytest.raises(cf.CreditflowError):  # the writer cannot go on writing
            w.write(batch(), timeout=1)


def test_explicit_fail_reaches_every_channel() -> None:
    with cf.NetworkEnvironment(memory="1MiB") as env:
        part = env.create_partition("p", 2)
        gates = [env.create_input_gate([spec(env, "p", i)]) for i in range(2)]
        w = cf.RecordWriter(part, cf.BroadcastPartitioner())
        w.write(batch(), timeout=STEP_TIMEOUT)
        w.fail("disk on fire")
        for g in gates:
            assert g.next(timeout=STEP_TIMEOUT).equals(batch())
            with pytest.raises(cf.ProducerFailedError, match="disk on fire"):
                g.next(timeout=STEP_TIMEOUT)


def test_close_twice_is_fine_and_write_after_close_is_closed_error() -> None:
    with cf.NetworkEnvironment(memory="1MiB") as env:
        part = env.create_partition("p")
        gate = env.create_input_gate([spec(env, "p")])
        w = cf.RecordWriter(part)
        w.write(batch(), timeout=STEP_TIMEOUT)
        w.close()
        w.close()
        with pytest.raises(cf.ClosedError) as info:
            w.write(batch(), timeout=1)
        assert isinstance(info.value, ValueError)
        w.fail("too late")  # after a normal end: no effect
        assert_batches_equal(read_all(gate), [batch()])
        # A second writer on the finished partition cannot write either.
        with pytest.raises(cf.ClosedError):
            cf.RecordWriter(part).write(batch(), timeout=1)


def test_environment_context_manager_closes() -> None:
    with cf.NetworkEnvironment(memory="1MiB") as env:
        assert isinstance(env, cf.NetworkEnvironment)
        assert not env.closed
        part = env.create_partition("p")
    assert env.closed
    assert part.released
    with pytest.raises(cf.ClosedError):
        env.create_partition("q")
    with pytest.raises(cf.ClosedError):
        env.create_input_gate([spec(env, "p")])
    env.close()  # idempotent
    with pytest.raises(ZeroDivisionError), cf.NetworkEnvironment(memory="1MiB") as env2:
        1 / 0  # noqa: B018 - exceptions are not swallowed
    assert env2.closed


@HANDOFF
def test_close_returns_every_segment(local_handoff: bool) -> None:
    env = cf.NetworkEnvironment(memory="1MiB", local_handoff=local_handoff)
    total = env.total_segments
    assert env.metrics()["segments_available"] == total
    part = env.create_partition("p", 2)
    gate = env.create_input_gate([spec(env, "p", 0), spec(env, "p", 1)])
    w = cf.RecordWriter(part)
    for i in range(4):
        w.write(big_batch(i, 64 * 1024), timeout=STEP_TIMEOUT)
    m = env.metrics()
    assert m["segments_available"] < total
    assert m["segments_reserved"] >= 3
    assert "p" in m["partitions"]
    env.close()
    gate.close()
    assert part.released
    assert env.metrics()["partitions"] == {}
    with pytest.raises(cf.ClosedError):
        w.write(batch(), timeout=1)
    w.close()
    assert env.metrics()["segments_available"] == total


@HANDOFF
def test_releasing_a_partition_returns_its_segments_while_the_writer_lives(local_handoff: bool) -> None:
    with cf.NetworkEnvironment(memory="1MiB", local_handoff=local_handoff) as env:
        total = env.total_segments
        part = env.create_partition("p", 2)
        gate = env.create_input_gate([spec(env, "p", 0), spec(env, "p", 1)])
        w = cf.RecordWriter(part)
        for i in range(4):
            w.write(big_batch(i, 64 * 1024), timeout=STEP_TIMEOUT)
        part.release()
        gate.close()
        # The writer object is still alive and not closed; the released partition must not
        # keep network memory pinned (its partly filled buffers included).
        assert part.released
        assert env.metrics()["segments_available"] == total
        with pytest.raises(cf.ClosedError):
            w.write(batch(), timeout=1)


@HANDOFF
def test_a_finished_and_fully_read_partition_is_released(local_handoff: bool) -> None:
    with cf.NetworkEnvironment(memory="1MiB", local_handoff=local_handoff) as env:
        part = env.create_partition("p", 2)
        gate = env.create_input_gate([spec(env, "p", 0), spec(env, "p", 1)])
        producer = write_all(part, [big_batch(i, 64 * 1024) for i in range(20)])
        assert len(read_all(gate)) == 20
        producer.finish()
        assert part.released
        m = env.metrics()
        assert m["partitions"] == {}
        assert m["segments_available"] == env.total_segments
        env.create_partition("p", 2)  # the id is free again


@HANDOFF
def test_closing_the_gate_unblocks_a_blocked_writer(local_handoff: bool) -> None:
    with cf.NetworkEnvironment(memory="1MiB", local_handoff=local_handoff) as env:
        part = env.create_partition("p")
        gate = env.create_input_gate([spec(env, "p")])
        items = [big_batch(i, 100 * 1024) for i in range(60)]  # ~6 MiB through 1 MiB
        producer = write_all(part, items, timeout=STEP_TIMEOUT)
        first = gate.next(timeout=STEP_TIMEOUT)
        assert first.equals(items[0])
        time.sleep(0.2)
        assert producer.is_alive(), "the writer should be blocked on the full pool"
        gate.close()
        producer.finish(timeout=5)  # the rest is dropped, the writer ends normally
        with pytest.raises(cf.ClosedError):
            gate.next(timeout=1)
        assert env.metrics()["segments_available"] == env.total_segments


# ---------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------


# The keys metrics() returns: the Rust structs' field names (creditflow.metrics).
PARTITION_KEYS = PartitionMetrics.__required_keys__
GATE_KEYS = GateMetrics.__required_keys__
ENV_KEYS = EnvMetrics.__required_keys__
POOL_KEYS = PoolStats.__required_keys__


@HANDOFF
def test_metrics_have_their_keys_and_sensible_numbers(local_handoff: bool) -> None:
    with cf.NetworkEnvironment(memory="4MiB", local_handoff=local_handoff, buffer_timeout=0) as env:
        part = env.create_partition("p", 3)
        gate = env.create_input_gate([spec(env, "p", i) for i in range(3)])
        batches = [big_batch(i, 8 * 1024 * (i + 1)) for i in range(6)]
        w = cf.RecordWriter(part, cf.RoundRobinPartitioner())
        for b in batches:
            w.write(b, timeout=STEP_TIMEOUT)
        m = part.metrics()
        assert set(m) == PARTITION_KEYS
        varying = ("out_pool_usage", "backpressured_ms_per_second", "busy_ms_per_second", "level")
        assert m == w.metrics() | {k: m[k] for k in varying}
        assert m["id"] == "p"
        assert m["num_subpartitions"] == 3
        assert len(m["backlog"]) == 3
        assert all(x >= 1 for x in m["backlog"])
        # Hand-off: one buffer per batch. Serialized: each subpartition's full segments (its two
        # batches make 40, 56 and 72 KiB of records); the rest is readable (buffer_timeout=0)
        # but not finished before close.
        assert m["backlog"] == ([2, 2, 2] if local_handoff else [1, 1, 2])
        assert m["batches_written"] == 6
        assert m["rows_written"] == sum(b.num_rows for b in batches)
        nbytes = sum(b.nbytes for b in batches)
        assert nbytes <= m["bytes_written"] <= nbytes * 1.25 + 4096
        assert m["buffers_written"] == sum(m["backlog"])  # nothing read yet
        assert 0.0 < m["out_pool_usage"] <= 1.0
        # 4 MiB holds every buffer: the writer never waited for one.
        assert m["level"] == "OK"
        assert m["backpressured_ms_per_second"] == 0.0
        assert m["finished"] is False
        assert set(m["pool"]) == POOL_KEYS
        assert m["pool"]["min"] == 4
        assert m["pool"]["max"] is None  # a partition's pool is unbounded
        assert m["pool"]["usage"] == m["out_pool_usage"]

        em = env.metrics()
        assert set(em) == ENV_KEYS
        assert em["address"] == env.address
        assert em["segment_size"] == SEG == env.segment_size
        assert em["segments_total"] == env.total_segments == (4 << 20) // SEG
        assert 0 <= em["segments_available"] < em["segments_total"]
        assert em["segments_allocated"] <= em["segments_total"]
        assert em["segments_reserved"] >= 4 + 1
        assert set(em["partitions"]) == {"p"}
        assert set(em["partitions"]["p"]) == PARTITION_KEYS
        assert len(em["gates"]) == 1

        w.close()
        got = read_all(gate)
        gm = gate.metrics()
        assert set(gm) == GATE_KEYS
        assert gm == next(iter(env.metrics()["gates"].values())) | {
            k: gm[k] for k in ("idle_ms_per_second", "busy_ms_per_second")
        }
        assert gm["num_channels"] == 3
        assert gm["ended_channels"] == 3
        assert gm["batches_received"] == len(got) == 6
        assert gm["rows_received"] == sum(b.num_rows for b in batches)
        assert gm["bytes_received"] >= nbytes
        assert gm["buffers_received"] >= 6 if local_handoff else gm["buffers_received"] >= 1
        assert gm["queued_batches"] == 0
        # Everything was written before the first read: the gate never waited for data.
        assert gm["idle_ms_per_second"] == 0.0
        assert gm["pool"]["usage"] == 0.0  # only remote channels take buffers from the gate's pool
        assert gm["remote"] is None  # every channel is local
        assert gm["debloat"] is None


# ---------------------------------------------------------------------------------------------
# Errors, ChannelSpec
# ---------------------------------------------------------------------------------------------

BUILTIN_BASES = {
    "AlreadyConsumedError": ValueError,
    "AuthenticationError": PermissionError,
    "ClosedError": ValueError,
    "ConnectionLostError": ConnectionError,
    "InvalidArgumentError": ValueError,
    "PartitionNotFoundError": LookupError,
    "SchemaMismatchError": ValueError,
    "TimeoutError": builtins.TimeoutError,
}


@pytest.mark.parametrize("name", creditflow.errors.__all__)
def test_error_hierarchy(name: str) -> None:
    cls = getattr(cf, name)
    assert cls is getattr(creditflow.errors, name)
    assert issubclass(cls, cf.CreditflowError)
    assert issubclass(cls, Exception)
    if name in BUILTIN_BASES:
        assert issubclass(cls, BUILTIN_BASES[name])
    assert name in cf.__all__


def test_creditflow_timeout_error_is_its_own_class() -> None:
    assert cf.TimeoutError is not builtins.TimeoutError
    assert issubclass(cf.TimeoutError, OSError)
    err = cf.InsufficientBuffersError("x", required=3, available=1, total=8, segment_size=4096)
    assert (err.required, err.available, err.total, err.segment_size) == (3, 1, 8, 4096)
    assert str(err) == "x"


def test_channel_spec_value_semantics() -> None:
    a = cf.ChannelSpec("127.0.0.1:1234", "job/s/0", 3)
    assert (a.address, a.partition_id, a.subpartition) == ("127.0.0.1:1234", "job/s/0", 3)
    b = cf.ChannelSpec("127.0.0.1:1234", "job/s/0", 3)
    assert a == b
    assert a is not b
    assert hash(a) == hash(b)
    assert len({a, b}) == 1
    assert {a: 1}[b] == 1
    for other in (
        cf.ChannelSpec("127.0.0.1:1235", "job/s/0", 3),
        cf.ChannelSpec("127.0.0.1:1234", "job/s/1", 3),
        cf.ChannelSpec("127.0.0.1:1234", "job/s/0", 2),
    ):
        assert a != other
    assert a != ("127.0.0.1:1234", "job/s/0", 3)
    r = repr(a)
    assert r.startswith("ChannelSpec(")
    assert "127.0.0.1:1234" in r
    assert "job/s/0" in r
    assert eval(r, {"ChannelSpec": cf.ChannelSpec}) == a
    with pytest.raises(AttributeError):
        a.subpartition = 4  # type: ignore[misc]
    with pytest.raises((OverflowError, ValueError, TypeError)):
        cf.ChannelSpec("x", "p", -1)


@pytest.mark.parametrize("overdraft", [5, 0])
def test_overdraft_buffers_finish_a_record_the_pool_cannot_hold(overdraft: int) -> None:
    """A serialized record larger than the partition's share (12 of 20 segments: the local
    gate's pool keeps 8) finishes on overdraft segments while nobody reads, with out-pool
    usage above 100%; without overdraft the writer stalls mid-record instead."""
    seg = 4096
    with cf.NetworkEnvironment(
        memory=20 * seg, segment_size=seg, local_handoff=False, overdraft_buffers=overdraft
    ) as env:
        part = env.create_partition("p")
        gate = env.create_input_gate([cf.ChannelSpec(env.address, "p", 0)])
        assert part.metrics()["pool"]["share"] == 12
        batch = pa.record_batch({"k": np.arange(14 * seg // 8 - 64, dtype=np.int64)})
        w = cf.RecordWriter(part)
        if overdraft:
            w.write(batch, timeout=1.0)
            assert part.metrics()["out_pool_usage"] > 1.0
            w.close()
            assert gate.next(timeout=5.0) == batch
            assert gate.next(timeout=5.0) is None
            assert part.metrics()["out_pool_usage"] <= 1.0
        else:
            with pytest.raises(cf.TimeoutError):
                w.write(batch, timeout=0.5)
        gate.close()
