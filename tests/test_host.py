"""The host service from Python: ``creditflow serve``, ``attach``, ``attach_or_start``, the
writer and the gate of an attachment (the same classes and API as an environment's), and the
faults: a killed service, a killed task.

Each test names its own service (a name per test and run), so tests never share one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import creditflow as cf
from creditflow.host import attach_or_start, log_path
from helpers import poll
from test_faults import read_to_close
from tls_certs import make_tls


def _name(what: str) -> str:
    return f"test-{what}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _batch(first: int, rows: int) -> pa.RecordBatch:
    return pa.record_batch(
        {"k": pa.array(range(first, first + rows), pa.int64()), "v": [str(i) for i in range(rows)]}
    )


@contextlib.contextmanager
def _serving(name: str, *options: str) -> Iterator[subprocess.Popen[str]]:
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


@pytest.fixture
def served() -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """``creditflow serve NAME --memory 16MiB``."""
    name = _name("served")
    with _serving(name, "--memory", "16MiB") as proc:
        yield name, proc


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
            w.write(_batch(i * 10_000, 10_000))
        w.broadcast_event(b"done")
    reader.join(timeout=60)
    assert sorted(k for b in got for k in b.column("k").to_pylist()) == list(range(200_000))
    assert part.schema == _batch(0, 1).schema
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
        w.write(_batch(i * 25_000, 25_000))
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
    name = _name("full-disk")

    def free() -> int:
        st = os.statvfs(small_tmpfs)
        return st.f_bavail * st.f_frsize

    empty = free()
    with _serving(name, "--memory", "4MiB", "--spill-dir", str(small_tmpfs)):
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
            w2.write(_batch(0, 50_000))
        gate = task.create_input_gate([cf.ChannelSpec(task.address, "again", 0)])
        assert pa.Table.from_batches(list(gate)).equals(pa.Table.from_batches([_batch(0, 50_000)]))
        gate.close()


def test_creditflow_serve_takes_tls_and_spill_settings_and_refuses_bad_ones_clearly(tmp_path: Path) -> None:
    """``creditflow serve`` with TLS files: an environment with TLS reads what a task wrote in
    the service, a plaintext one is refused; with ``--max-spill`` a blocking partition past it
    fails its writer naming the setting. A bad setting exits 2 with its message, nothing
    started."""
    tls = make_tls(tmp_path)
    name = _name("tls")
    options = ["--tls-cert", str(tls.cert), "--tls-key", str(tls.key), "--tls-ca", str(tls.ca)]
    spill = ["--memory", "4MiB", "--spill-dir", str(tmp_path / "spill"), "--max-spill", "1MiB"]
    with _serving(name, *options, *spill, "--peer-timeout", "4"):
        task = cf.attach(name)
        part = task.create_partition("p", 1)
        with cf.RecordWriter(part) as w:
            w.write(_batch(0, 1000))
        with cf.NetworkEnvironment(memory="1MiB", tls=tls) as env:
            got = list(env.create_input_gate([cf.ChannelSpec(task.address, "p", 0)]))
        assert pa.Table.from_batches(got).equals(pa.Table.from_batches([_batch(0, 1000)]))
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
            [sys.executable, "-m", "creditflow", "serve", _name("bad"), *bad],
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
    name = _name("settings")
    options = ("--memory", "16MiB", "--no-local-handoff", "--debloat", "--handshake-timeout", "0.5")
    with _serving(name, *options):
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
    with cf.HostService(_name("a"), **settings) as a, cf.HostService(_name("b"), **settings) as b:
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

    name = _name("metrics")
    with _serving(name, "--memory", "16MiB", "--metrics-port", "0") as proc:
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
            w.write(_batch(i * 10_000, 10_000))
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
    with cf.HostService(_name("collected"), memory="4MiB") as service:
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
        w.write(_batch(i * rows, rows), timeout=30)


def _bytes_written(producer: cf.NetworkEnvironment | cf.Attachment, consumer: Any) -> int:
    """Writes 20 batches split in two through ``producer`` while ``consumer`` reads them; the
    partition's ``bytes_written``."""
    part = producer.create_partition("counted/0", 2)
    gate = consumer.create_input_gate([cf.ChannelSpec(producer.address, "counted/0", i) for i in range(2)])
    reader = threading.Thread(target=lambda: sum(1 for _ in gate))
    reader.start()
    with cf.RecordWriter(part, cf.HashPartitioner("k")) as w:
        for i in range(20):
            w.write(_batch(i * 10_000, 10_000))
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
    w.write(_batch(0, 3))
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


def test_starting_a_service_removes_the_logs_of_services_long_gone() -> None:
    from creditflow.host import LOG_KEEP_DAYS, _keep_log

    old, recent = log_path(_name("gone")), log_path(_name("recent"))
    for path in (old, recent):
        path.write_text("a service's last words\n")
    week_ago = time.time() - (LOG_KEEP_DAYS + 1) * 86400
    os.utime(old, (week_ago, week_ago))
    os.utime(recent, (time.time() - 86400,) * 2)
    name = _name("pruner")
    a = attach_or_start(name, {"memory": "8MiB"}, idle_timeout=1.0)
    a.close()
    assert not old.exists()
    assert recent.exists()
    assert log_path(name).exists()
    recent.unlink()
    # A running service marks its log as written, however quiet it is.
    kept = log_path(_name("kept"))
    kept.write_text("")
    os.utime(kept, (week_ago, week_ago))
    ended = threading.Event()
    keeper = threading.Thread(target=_keep_log, args=(kept.stem, ended, 0.05))
    keeper.start()
    poll("the log marked as written", lambda: kept.stat().st_mtime > time.time() - 60, deadline=10)
    ended.set()
    keeper.join(10)
    kept.unlink()


def test_concurrent_starters_get_one_service_which_ends_when_idle(tmp_path: Path) -> None:
    name = _name("ondemand")
    script = textwrap.dedent(
        f"""
        from creditflow.host import attach_or_start
        a = attach_or_start({name!r}, {{"memory": "8MiB"}}, idle_timeout=1.0)
        print(a.service_pid, flush=True)
        """
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) for _ in range(3)
    ]
    pids = {p.communicate(timeout=120)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(pids) == 1, pids
    service = int(pids.pop())
    # Nothing attached any more: it ends after its idle time and frees its name.
    deadline = time.monotonic() + 30
    while _alive(service):
        assert time.monotonic() < deadline, f"the service did not end: {log_path(name).read_text()}"
        time.sleep(0.1)
    assert "no task attached" in log_path(name).read_text()
    with pytest.raises(cf.ConnectionLostError, match="no creditflow host service"):
        cf.attach(name)


class _Waits:
    """Stands in for a ``HostService`` in :class:`~creditflow.host._StopSignals`' wait."""

    def __init__(self, signum: int | None = None) -> None:
        self.signum = signum
        self.calls = 0

    def wait(self) -> str:
        self.calls += 1
        if self.signum is not None:
            signal.raise_signal(self.signum)
        time.sleep(10)  # the signal's handler interrupts this at once
        return "ended"


def test_ctrl_c_and_sigterm_end_the_service_s_wait_and_interrupt_nothing_else() -> None:
    """A stop signal that comes while the service's main thread is elsewhere (here: inside a
    logging handler, holding its lock) is noted, not raised there, so that no lock is left
    taken; the wait then ends at once. One during the wait ends it."""
    from creditflow.host import _StopSignals

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    class Signalling(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            signal.raise_signal(signal.SIGTERM)
            time.sleep(0.01)  # the handler runs here, within the lock

    log = logging.getLogger(f"test-stop-signals-{uuid.uuid4().hex}")
    log.propagate = False
    handler = Signalling()
    log.addHandler(handler)
    with _StopSignals() as stop:
        try:
            log.warning("a record")
        except KeyboardInterrupt:  # what the default handler does, with the lock taken
            pytest.fail("the signal was raised inside the logging handler")
        assert stop.got == "SIGTERM"
        # The handler's lock is free: another thread takes it.
        lock = handler.lock
        assert lock is not None
        taken: list[bool] = []

        def take() -> None:
            taken.append(lock.acquire(timeout=5))
            if taken[-1]:
                lock.release()

        free = threading.Thread(target=take)
        free.start()
        free.join(10)
        assert taken == [True]
        service = _Waits()
        assert stop.wait(service) == "interrupted (SIGTERM)"
        assert service.calls == 0
    log.removeHandler(handler)
    with _StopSignals() as stop:
        service = _Waits(signal.SIGINT)
        start = time.monotonic()
        assert stop.wait(service) == "interrupted (SIGINT)"
        assert time.monotonic() - start < 5
        assert service.calls == 1
        # After the wait a signal is noted again, not raised.
        signal.raise_signal(signal.SIGTERM)
        time.sleep(0.01)
        assert stop.got == "SIGTERM"
    assert {s: signal.getsignal(s) for s in before} == before


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (the test is not its parent, so it is reaped by init) counts as gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


def test_a_killed_service_fails_attached_tasks_within_two_seconds_and_the_next_use_starts_one() -> None:
    name = _name("killed")
    a = attach_or_start(name, {"memory": "4MiB"})
    gate = a.create_input_gate([cf.ChannelSpec(a.address, "never-written", 0)])
    part = a.create_partition("full", 1)
    writer = cf.RecordWriter(part)
    outcome: dict[str, BaseException | None] = {}

    def read() -> None:
        try:
            gate.next()
            outcome["read"] = None
        except BaseException as exc:
            outcome["read"] = exc

    def write() -> None:
        try:
            while True:  # nobody reads: the service holds the writer back
                writer.write(_batch(0, 20_000))
        except BaseException as exc:
            outcome["write"] = exc

    threads = [threading.Thread(target=read, daemon=True), threading.Thread(target=write, daemon=True)]
    for t in threads:
        t.start()
    poll("the writer held back", lambda: part.metrics()["backpressured_total"] > 0)
    os.kill(a.service_pid, signal.SIGKILL)
    # Both blocked calls end within 2 s of the kill (a bounded wait, not a measurement).
    deadline = time.monotonic() + 2.0
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), f"still blocked 2 s after the kill: {outcome}"
    for what in ("read", "write"):
        assert isinstance(outcome[what], cf.ConnectionLostError), (what, outcome[what])
    poll("the attachment closed", lambda: a.closed, deadline=2.0, every=0.05)
    with pytest.raises(cf.ConnectionLostError):
        part.flush()
    with pytest.raises(cf.ConnectionLostError):
        a.create_partition("after", 1)
    # The next use starts a new service.
    b = attach_or_start(name, {"memory": "4MiB"})
    assert b.service_pid != a.service_pid
    part = b.create_partition("full", 1)  # the name is free again in the new one
    os.kill(b.service_pid, signal.SIGTERM)


def test_a_task_killed_while_attached_frees_its_reservations_and_fails_its_unfinished_partitions(
    served: tuple[str, subprocess.Popen[str]],
) -> None:
    name, _ = served
    observer = cf.attach(name)
    before = observer.metrics()
    # What a finished blocking partition of 2 subpartitions keeps reserved (it outlives its task).
    probe = observer.create_partition("probe", 2, kind="blocking")
    kept = observer.metrics()["segments_reserved"] - before["segments_reserved"]
    probe.release()
    assert observer.metrics()["segments_reserved"] == before["segments_reserved"]
    # The task writes part of a pipelined and of a blocking partition, finishes a third,
    # holds a gate, and is killed before it finishes the first two.
    script = textwrap.dedent(
        f"""
        import time, pyarrow as pa, creditflow as cf
        a = cf.attach({name!r})
        batch = pa.record_batch({{"k": list(range(1000))}})
        writers = []  # held: a writer dropped without close fails its partition at once
        for pid, kind in (("piped", "pipelined"), ("stored", "blocking"), ("done", "blocking")):
            w = cf.RecordWriter(a.create_partition(pid, 2, kind=kind), cf.RoundRobinPartitioner())
            writers.append(w)
            w.write(batch)
            w.flush()
            if pid == "done":
                w.close()
        g = a.create_input_gate([cf.ChannelSpec(a.address, "nobody-writes", 0)])
        print("wrote", flush=True)
        time.sleep(600)
        """
    )
    with subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) as task:
        try:
            assert task.stdout is not None
            assert task.stdout.readline().strip() == "wrote"
            held = observer.metrics()
            assert held["sessions"] == before["sessions"] + 1
            assert held["segments_reserved"] > before["segments_reserved"]
            assert held["gates"] == before["gates"] + 1
            piped = [cf.ChannelSpec(observer.address, "piped", i) for i in range(2)]
            gate = observer.create_input_gate(piped)
            got = gate.next(timeout=30)
            assert got is not None
        finally:
            task.kill()
    # What was written comes whole, then the failure: never a normal end.
    rows = [got.num_rows]

    def drain() -> None:
        for b in gate.items(timeout=10):
            assert isinstance(b, cf.Batch), b
            rows.append(b.batch.num_rows)

    with pytest.raises(cf.ProducerFailedError, match=f"pid {task.pid}"):
        drain()
    assert sum(rows) <= 1000
    # A finished blocking partition outlives the task that wrote it.
    done = observer.create_input_gate([cf.ChannelSpec(observer.address, "done", i) for i in range(2)])
    assert sum(b.num_rows for b in done) == 1000
    # Its session, gate and reservations are gone with it.
    poll("the task's session ended", lambda: observer.metrics()["sessions"] == before["sessions"])
    # No gate is open: the killed task's went with its session, and this test's two have
    # ended (an ended gate is not counted, though its handle lives).
    poll(
        "the killed task's gate closed",
        lambda: observer.metrics()["gates"] == before["gates"],
        deadline=10,
    )
    for g in (gate, done):
        g.close()
    # All it reserved is free again but what its finished partition keeps.
    poll(
        "the killed task's reservations freed",
        lambda: observer.metrics()["segments_reserved"] == before["segments_reserved"] + kept,
        deadline=10,
    )
    # The blocking partition it had not finished is gone with it (nothing in it is whole).
    assert observer.metrics()["partitions"] == before["partitions"] + 1


def test_a_killed_service_of_a_crashed_application_is_cleaned_up_by_the_next(tmp_path: Path) -> None:
    name = _name("crashed")
    settings = {"memory": "4MiB", "spill_dir": str(tmp_path)}
    with subprocess.Popen(["sleep", "600"]) as executor:
        a = attach_or_start(name, settings, owner=executor.pid)
        w = cf.RecordWriter(a.create_partition("kept", 1, kind="blocking"))
        w.write(_batch(0, 50_000))
        w.close()
        spilled = [d for d in tmp_path.iterdir() if d.is_dir()]
        assert len(spilled) == 1
        assert spilled[0].name.startswith(f"{a.service_pid}-")
        # The application crashes: its service killed, then its executor.
        os.kill(a.service_pid, signal.SIGKILL)
        poll("the killed service gone", lambda: not _alive(a.service_pid))
        executor.kill()
    assert spilled[0].exists()  # what the killed service left
    # The next application's service (same spill root) removes it when it starts.
    b = attach_or_start(_name("next"), settings)
    assert not spilled[0].exists()
    live = [d for d in tmp_path.iterdir() if d.is_dir()]
    assert [d.name.split("-")[0] for d in live] == [str(b.service_pid)]
    os.kill(b.service_pid, signal.SIGTERM)
    poll("the next service ended", lambda: not _alive(b.service_pid))
    assert not [d for d in tmp_path.iterdir() if d.is_dir()]


def test_a_service_whose_executors_are_gone_ends_and_removes_its_spill_files(tmp_path: Path) -> None:
    name = _name("orphan")
    with subprocess.Popen(["sleep", "600"]) as executor:
        a = attach_or_start(name, {"memory": "4MiB", "spill_dir": str(tmp_path)}, owner=executor.pid)
        w = cf.RecordWriter(a.create_partition("kept", 1, kind="blocking"))
        w.write(_batch(0, 10_000))
        w.close()
        a.close()
        assert [d for d in tmp_path.iterdir() if d.is_dir()]
        executor.kill()
    poll("the service ended with its executor", lambda: not _alive(a.service_pid))
    assert not [d for d in tmp_path.iterdir() if d.is_dir()]
    assert "ended" in log_path(name).read_text()
    with pytest.raises(cf.ConnectionLostError):
        cf.attach(name)


def test_serve_stops_on_sigterm_and_frees_its_name(served: tuple[str, subprocess.Popen[str]]) -> None:
    name, proc = served
    cf.attach(name).close()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    with pytest.raises(cf.ConnectionLostError):
        cf.attach(name)


def test_bad_names_and_settings_are_refused() -> None:
    with pytest.raises(cf.InvalidArgumentError, match="host service name"):
        cf.HostService("a/b")
    with pytest.raises(ValueError, match="refusing to bind"):
        cf.HostService(_name("open"), bind="0.0.0.0:0")
    with pytest.raises(ValueError, match="not settings of a host service"):
        attach_or_start(_name("bad"), {"colour": "red"})
    with cf.HostService(_name("twice")) as s, pytest.raises(cf.InvalidArgumentError, match="already runs"):
        cf.HostService(s.name)
