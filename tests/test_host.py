"""The host service from Python: ``creditflow serve``, ``attach``, ``attach_or_start``, the
writer and the gate of an attachment (the same classes and API as an environment's), its
settings and metrics. Its start, end and faults: ``tests/test_host_lifecycle.py``.

Each test names its own service (a name per test and run), so tests never share one.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import creditflow as cf
from helpers import poll
from host_service import name_for, numbered_batch, serving
from test_faults import read_to_close
from tls_certs import make_tls


def test_a_pipeline_without_spark_writes_and_reads_through_a_served_host_service(
    served: tuple[str, subprocess.Popen[str]],
) -> None:
    name, proc = served
    producer, consumer = cf.attach(name), cf.attach(name)
    assert producer.service_pid == proc.pid
    assert producer.address == consumer.address
    part = producer.create_partition("job/0", 2)
    assert isinstance(part, cf.ResultPartition)
    assert part.num_subpartitions == 2
    gate = consumer.create_input_gate([cf.ChannelSpec(producer.address, "job/0", i) for i in range(2)])
    assert isinstance(gate, cf.InputGate)
    assert gate.num_channels == 2
    got: list[pa.RecordBatch] = []
    reader = threading.Thread(target=lambda: got.extend(gate))
    reader.start()
    with cf.RecordWriter(part, cf.HashPartitioner("k")) as w:
        for i in range(20):
            w.write(numbered_batch(i * 10_000, 10_000))
        w.broadcast_event(b"done")
    reader.join(timeout=60)
    assert sorted(k for b in got for k in b.column("k").to_pylist()) == list(range(200_000))
    assert part.schema == numbered_batch(0, 1).schema
    assert part.finished
    # The same metrics an environment's objects give, from the service.
    pm, gm = part.metrics(), gate.metrics()
    assert pm["rows_written"] == 200_000
    assert pm["num_subpartitions"] == 2
    assert gm["rows_received"] == 200_000
    assert [c["kind"] for c in gm["channels"]] == ["ended", "ended"]
    sm = producer.metrics()
    assert sm["sessions"] == 2
    assert sm["connections_opened"] == 0
    assert sm["connections_served"] == 0
    # Each batch split in two; pieces of about 80 KB lie in the writer's heap and reach the
    # reading task there, uncopied (a piece that did not fit would be copied).
    assert sm["batches_in_place"] + sm["batches_copied"] == 40
    assert sm["batches_in_place"] > 0
    gate.close()


def test_batches_a_reader_let_go_unread_are_freed_for_the_writer(
    served: tuple[str, subprocess.Popen[str]],
) -> None:
    name, _ = served
    producer, consumer = cf.attach(name), cf.attach(name)
    part = producer.create_partition("unread/0", 1)
    gate = consumer.create_input_gate([cf.ChannelSpec(producer.address, "unread/0", 0)])
    w = cf.RecordWriter(part, cf.ForwardPartitioner())
    for i in range(6):  # about 200 KB each: every one lies in the writer's heap
        w.write(numbered_batch(i * 25_000, 25_000))
    w.flush()
    held = gate.next(timeout=30)
    assert held is not None
    assert held.column("k").to_pylist() == list(range(25_000))
    poll("the batches handed over in place", lambda: producer.metrics()["batches_in_place"] == 6, every=0.01)
    # Five batches left on the gate's link: the service frees their place in the writer's
    # heap (not the one the reader holds, which stays as it arrived).
    gate.close()
    poll("the unread batches freed", lambda: producer.metrics()["pieces_reclaimed"] >= 5, every=0.05)
    time.sleep(0.6)
    assert producer.metrics()["pieces_reclaimed"] == 5
    assert held.column("k").to_pylist() == list(range(25_000))
    w.close()


def test_a_full_disk_fails_the_task_s_writer_clearly_and_the_service_serves_on(small_tmpfs: Path) -> None:
    """A blocking partition in the service that spills to a full disk fails the task's writer
    with ``SpillError`` (the file and the OS's reason), its reader with ``ProducerFailedError``
    (nothing partial taken for complete); released, its file goes and the disk is free again,
    and the service goes on serving."""
    name = name_for("full-disk")

    def free() -> int:
        st = os.statvfs(small_tmpfs)
        return st.f_bavail * st.f_frsize

    empty = free()
    with serving(name, "--memory", "4MiB", "--spill-dir", str(small_tmpfs)):
        task = cf.attach(name)
        part = task.create_partition("full", 1, kind="blocking")
        w = cf.RecordWriter(part)
        with pytest.raises(cf.SpillError) as info:
            _write_batches(w, 100, 100_000)  # about 2 MB each into 4 MiB of disk
        message = str(info.value)
        assert str(small_tmpfs) in message, message
        assert "No space left on device" in message, message
        assert isinstance(info.value, OSError)
        assert free() < 64 << 10
        gate = task.create_input_gate([cf.ChannelSpec(task.address, "full", 0)])
        with pytest.raises(cf.ProducerFailedError, match="spill failed"):
            gate.next(timeout=30)
        gate.close()
        part.release()
        poll("the failed partition's spill file removed", lambda: free() >= empty - (64 << 10), every=0.05)
        # The service serves on: a new blocking partition, written and read back whole.
        again = task.create_partition("again", 1, kind="blocking")
        with cf.RecordWriter(again) as w2:
            w2.write(numbered_batch(0, 50_000))
        gate = task.create_input_gate([cf.ChannelSpec(task.address, "again", 0)])
        assert pa.Table.from_batches(list(gate)).equals(pa.Table.from_batches([numbered_batch(0, 50_000)]))
        gate.close()


def test_creditflow_serve_takes_tls_and_spill_settings_and_refuses_bad_ones_clearly(tmp_path: Path) -> None:
    """``creditflow serve`` with TLS files: an environment with TLS reads what a task wrote in
    the service, a plaintext one is refused; with ``--max-spill`` a blocking partition past it
    fails its writer naming the setting. A bad setting exits 2 with its message, nothing
    started."""
    tls = make_tls(tmp_path)
    name = name_for("tls")
    options = ["--tls-cert", str(tls.cert), "--tls-key", str(tls.key), "--tls-ca", str(tls.ca)]
    spill = ["--memory", "4MiB", "--spill-dir", str(tmp_path / "spill"), "--max-spill", "1MiB"]
    with serving(name, *options, *spill, "--peer-timeout", "4"):
        task = cf.attach(name)
        part = task.create_partition("p", 1)
        with cf.RecordWriter(part) as w:
            w.write(numbered_batch(0, 1000))
        with cf.NetworkEnvironment(memory="1MiB", tls=tls) as env:
            got = list(env.create_input_gate([cf.ChannelSpec(task.address, "p", 0)]))
        assert pa.Table.from_batches(got).equals(pa.Table.from_batches([numbered_batch(0, 1000)]))
        with cf.NetworkEnvironment(memory="1MiB") as plain:
            gate = plain.create_input_gate([cf.ChannelSpec(task.address, "p", 0)])
            with pytest.raises(cf.AuthenticationError, match="requires TLS"):
                gate.next(timeout=30)
        big = task.create_partition("big", 1, kind="blocking")
        with pytest.raises(cf.SpillError, match="max_spill"):
            _write_batches(cf.RecordWriter(big), 10, 100_000)  # about 2 MB each past 4 MiB
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    for bad, message in [
        (["--metrics-port", str(busy.getsockname()[1])], "Address already in use"),
        (["--metrics-port", "70000"], "0..65535"),
        (["--wire-compression", "bogus"], "wire_compression"),
        (["--memory", "lots"], "memory"),
        (["--peer-timeout", "soon"], "--peer-timeout"),
        (["--tls-cert", str(tls.cert)], "all three of --tls-cert, --tls-key and --tls-ca"),
        (["--secret-file", str(tmp_path / "missing")], "--secret-file"),
    ]:
        r = subprocess.run(
            [sys.executable, "-m", "creditflow", "serve", name_for("bad"), *bad],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 2, (bad, r.stdout, r.stderr)
        assert "creditflow serve: error: " in r.stderr, (bad, r.stderr)
        assert message in r.stderr, (bad, r.stderr)
        assert "Traceback" not in r.stderr, (bad, r.stderr)
        assert "listening" not in r.stderr or "metrics" in bad[0], (bad, r.stderr)
    busy.close()


def test_a_served_service_takes_an_environment_s_other_settings_and_its_tasks_see_them() -> None:
    """``creditflow serve`` gives its environment the settings a ``NetworkEnvironment`` takes
    beyond the pool and the listener: without local hand-off its tasks' batches are serialized
    into its segments (with it, they reach the reader in place: the pipeline test above), its
    gates debloat, and a peer silent past its handshake timeout is cut (the default waits 10 s)."""
    name = name_for("settings")
    options = ("--memory", "16MiB", "--no-local-handoff", "--debloat", "--handshake-timeout", "0.5")
    with serving(name, *options):
        producer, consumer = cf.attach(name), cf.attach(name)
        part = producer.create_partition("settings/0", 1)
        gate = consumer.create_input_gate([cf.ChannelSpec(producer.address, "settings/0", 0)])
        assert gate.metrics()["debloat"] is not None, "the service's gates debloat"
        got: list[pa.RecordBatch] = []
        reader = threading.Thread(target=lambda: got.extend(gate))
        reader.start()
        with cf.RecordWriter(part) as w:
            _write_batches(w, 10, 10_000)
        reader.join(timeout=60)
        assert sorted(k for b in got for k in b.column("k").to_pylist()) == list(range(100_000))
        # Serialized into the service's 32 KiB segments (about five a batch) and decoded for
        # the reader, not handed over whole in place.
        pm, sm = part.metrics(), producer.metrics()
        assert pm["batches_written"] == 10
        assert pm["buffers_written"] >= 40, pm
        assert sm["batches_copied"] == 10, sm
        assert sm["batches_in_place"] == 0, sm
        host, port = producer.address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as silent:
            read_to_close(silent, timeout=5.0)
        gate.close()


@pytest.mark.parametrize("flow_control", ["credit", "tcp"])
@pytest.mark.parametrize("shared_memory", [True, False], ids=["shm", "tcp-links"])
@pytest.mark.parametrize("local_handoff", [True, False], ids=["handoff", "serialized"])
def test_services_with_any_flow_control_transport_and_hand_off_deliver_every_row(
    flow_control: str, shared_memory: bool, local_handoff: bool
) -> None:
    """Two services (two hosts' worth) with the same settings: a partition in the first has one
    subpartition read by a task of its own service and one by a task of the other, over the
    services' one connection (shared memory or TCP between them). Every row arrives once."""
    settings: dict[str, Any] = {
        "memory": "16MiB",
        "flow_control": flow_control,
        "shared_memory": shared_memory,
        "local_handoff": local_handoff,
    }
    with cf.HostService(name_for("a"), **settings) as a, cf.HostService(name_for("b"), **settings) as b:
        writer, near, far = cf.attach(a.name), cf.attach(a.name), cf.attach(b.name)
        part = writer.create_partition("both/0", 2)
        gates = [
            near.create_input_gate([cf.ChannelSpec(a.address, "both/0", 0)]),
            far.create_input_gate([cf.ChannelSpec(a.address, "both/0", 1)]),
        ]
        keys: list[list[int]] = [[], []]

        def read(i: int) -> None:
            keys[i].extend(k for batch in gates[i] for k in batch.column("k").to_pylist())

        readers = [threading.Thread(target=read, args=(i,)) for i in range(2)]
        for r in readers:
            r.start()
        with cf.RecordWriter(part, cf.HashPartitioner("k")) as w:
            _write_batches(w, 40, 5_000)
        for r in readers:
            r.join(timeout=60)
        assert sorted(keys[0] + keys[1]) == list(range(200_000))
        assert keys[0], "the near reader got rows"
        assert keys[1], "the far reader got rows"
        assert a.metrics()["connections_served"] == 1
        assert b.metrics()["connections_opened"] == 1
        for g in gates:
            g.close()


def test_creditflow_serve_serves_its_metrics_and_its_tasks_partitions_and_gates_for_prometheus() -> None:
    """``creditflow serve --metrics-port 0``: one scrape has the service's own families (tasks
    attached, batches in place or copied) and its environment's (pool, the tasks' partitions
    and gates), labelled with its address."""
    from prometheus_client.parser import text_string_to_metric_families

    name = name_for("metrics")
    with serving(name, "--memory", "16MiB", "--metrics-port", "0") as proc:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert f"creditflow host service {name!r} metrics at http://127.0.0.1:" in line, line
        url = line.split(" metrics at ")[1].strip()
        producer, consumer = cf.attach(name), cf.attach(name)
        part = producer.create_partition("m/0", 2)
        gate = consumer.create_input_gate([cf.ChannelSpec(producer.address, "m/0", i) for i in range(2)])
        got: list[pa.RecordBatch] = []
        reader = threading.Thread(target=lambda: got.extend(gate))
        reader.start()
        w = cf.RecordWriter(part, cf.HashPartitioner("k"))
        for i in range(20):
            w.write(numbered_batch(i * 10_000, 10_000))
        w.flush()
        # Scraped while the partition is open (a read pipelined one goes once its writer ends).
        poll("every row read", lambda: sum(b.num_rows for b in got) == 200_000, every=0.01)
        with urllib.request.urlopen(url, timeout=30) as r:
            text = r.read().decode()
        w.close()
        reader.join(timeout=60)
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }
        me = producer.address
        assert samples[("creditflow_service_sessions", (("service", me),))] == 2
        in_place = samples[("creditflow_service_batches_in_place_total", (("service", me),))]
        copied = samples[("creditflow_service_batches_copied_total", (("service", me),))]
        assert in_place + copied == 40
        assert in_place > 0
        assert samples[("creditflow_segments", (("env", me),))] == (16 << 20) // (32 << 10)
        written = ("creditflow_partition_written_rows_total", (("env", me), ("partition", "m/0")))
        assert samples[written] == 200_000
        gates = [k for k in samples if k[0] == "creditflow_gate_received_rows_total"]
        assert [samples[k] for k in gates] == [200_000]
        gate.close()


def test_a_collector_reads_a_service_until_it_ends_and_nothing_after() -> None:
    """A Prometheus collector of a ``HostService`` in this process reads its families and its
    environment's while it runs; once it has ended (``closed``), nothing, as for a closed
    environment."""
    from prometheus_client import CollectorRegistry, generate_latest

    from creditflow.prometheus import register

    registry = CollectorRegistry(auto_describe=False)
    with cf.HostService(name_for("collected"), memory="4MiB") as service:
        register(service, registry)
        assert not service.closed
        text = generate_latest(registry).decode()
        assert f'creditflow_service_sessions{{service="{service.address}"}} 0.0' in text
        assert f'creditflow_segments{{env="{service.address}"}} 128.0' in text
    assert service.closed
    text = generate_latest(registry).decode()
    assert "creditflow_service_sessions" not in text
    assert "creditflow_segments" not in text


def _write_batches(w: cf.RecordWriter, n: int, rows: int) -> None:
    """Writes ``n`` batches of ``rows`` rows (the caller may expect one of them to raise)."""
    for i in range(n):
        w.write(numbered_batch(i * rows, rows), timeout=30)


def _bytes_written(producer: cf.NetworkEnvironment | cf.Attachment, consumer: Any) -> int:
    """Writes 20 batches split in two through ``producer`` while ``consumer`` reads them; the
    partition's ``bytes_written``."""
    part = producer.create_partition("counted/0", 2)
    gate = consumer.create_input_gate([cf.ChannelSpec(producer.address, "counted/0", i) for i in range(2)])
    reader = threading.Thread(target=lambda: sum(1 for _ in gate))
    reader.start()
    with cf.RecordWriter(part, cf.HashPartitioner("k")) as w:
        for i in range(20):
            w.write(numbered_batch(i * 10_000, 10_000))
    reader.join(timeout=60)
    gate.close()
    return int(part.metrics()["bytes_written"])


def test_the_service_counts_a_batch_s_bytes_once_as_an_environment_does(
    served: tuple[str, subprocess.Popen[str]],
) -> None:
    """What a partition in the service counts (in its pool and its ``bytes_written``) for a
    batch is its bytes, as in a task's own environment: not each of the batch's column buffers
    at the size of the whole record it came in, which would fill the host's memory with a
    fraction of the data it says it holds."""
    name, _ = served
    with cf.NetworkEnvironment(memory="64MiB") as env:
        own = _bytes_written(env, env)
    producer, consumer = cf.attach(name), cf.attach(name)
    in_service = _bytes_written(producer, consumer)
    assert own > 20 * 10_000 * 8
    assert in_service == pytest.approx(own, rel=0.02)


def test_a_task_s_memory_sizes_its_writers_heaps_and_a_bad_one_is_refused(
    served: tuple[str, subprocess.Popen[str]],
) -> None:
    """A task's own ``memory`` (not the host's) is the heap each of its writers places batches
    in: what it holds in place in its own process, as an environment's ``memory`` bounds it."""
    name, _ = served
    assert cf.attach(name).writer_heap == 64 << 20
    assert cf.attach(name, memory="8MiB").writer_heap == 8 << 20
    # Whole 64 KiB chunks, at least 1 MiB, at most 1 GiB.
    assert cf.attach(name, memory=3_000_000).writer_heap == 46 << 16
    assert cf.attach(name, memory="64KiB").writer_heap == 1 << 20
    assert cf.attach(name, memory="8GiB").writer_heap == 1 << 30
    with pytest.raises(ValueError, match="memory"):
        cf.attach(name, memory="lots")
    with pytest.raises(ValueError, match="memory must be a non-negative number of bytes"):
        cf.attach(name, memory=-1)
    with pytest.raises(TypeError, match="memory must be an int"):
        cf.attach(name, memory=1.5)  # type: ignore[arg-type]
    # A reader that holds every batch keeps the writer's heap taken: 2 MiB holds four pieces of
    # about 480 KB (eight 64 KiB chunks each); the rest are copied by the service.
    writer, reader = cf.attach(name, memory="2MiB"), cf.attach(name)
    part = writer.create_partition("held", 1)
    gate = reader.create_input_gate([cf.ChannelSpec(writer.address, "held", 0)])
    before = writer.metrics()["batches_in_place"]
    held = []
    items = gate.items(timeout=30)
    with cf.RecordWriter(part) as w:
        for i in range(12):
            sent = pa.record_batch(
                {
                    "k": pa.array(range(i * 20_000, (i + 1) * 20_000), pa.int64()),
                    "v": pa.array([b"x" * 12] * 20_000, pa.binary()),
                }
            )
            w.write(sent)
            got = next(items)
            assert isinstance(got, cf.Batch)
            assert got.batch.equals(sent)
            held.append(got.batch)
    assert writer.metrics()["batches_in_place"] - before == 4
    gate.close()


def test_a_spark_worker_keeps_an_attachment_per_service_and_task_memory(
    served: tuple[str, subprocess.Popen[str]],
) -> None:
    from creditflow.spark import _process

    name, proc = served
    kept = _process._Attachments()
    small = kept.get(name, {}, "8MiB")
    assert small.service_pid == proc.pid
    assert small.writer_heap == 8 << 20
    assert kept.get(name, {}, 8 << 20) is small
    big = kept.get(name, {}, "32MiB")
    assert big is not small
    assert big.writer_heap == 32 << 20
    assert kept.count() == 2
    small.close()
    assert kept.get(name, {}, "8MiB") is not small


def test_items_events_and_errors_come_through_as_from_an_environment(
    served: tuple[str, subprocess.Popen[str]],
) -> None:
    name, _ = served
    a = cf.attach(name)
    part = a.create_partition("ev", 1)
    with pytest.raises(cf.InvalidArgumentError, match="already exists"):
        a.create_partition("ev", 1)
    gate = a.create_input_gate([cf.ChannelSpec(a.address, "ev", 0)])
    w = cf.RecordWriter(part)
    w.write(numbered_batch(0, 3))
    w.emit_event(b"hello", 0)
    with pytest.raises(cf.SchemaMismatchError):
        w.write(pa.record_batch({"other": [1]}))
    w.fail("gave up")
    items = gate.items(timeout=30)
    first = next(items)
    assert isinstance(first, cf.Batch)
    assert first.batch.num_rows == 3
    assert next(items) == cf.Event(0, b"hello")
    with pytest.raises(cf.ProducerFailedError, match="gave up"):
        next(items)
    with pytest.raises(cf.InsufficientBuffersError):
        a.create_partition("huge", 10_000)
