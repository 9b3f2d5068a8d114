"""creditflow.spark across hosts: a Spark standalone cluster whose two workers are hosts of
their own (network namespaces with their own addresses, ``tests/multihost.py``), the driver
outside them, one executor of 2 cores per worker.

Checked: an exchange whose rows cross between the hosts puts every row where Spark's
``repartition`` does, with the exchange's secret and with TLS (and a certificate that does not
name the hosts' addresses is refused); a ``Monitor`` made on the driver hears the tasks of
both hosts; ``send`` streams to a receiver on a third host, from the
executors and from the driver, with a secret and with TLS; an executor JVM killed with SIGKILL
in the middle of an exchange, and the link between the two hosts cut in the middle of one,
each fail that attempt (the cut with a ``ConnectionLostError`` naming the other host) and
Spark's retry gives the same result, every row once. The tasks use their hosts' creditflow
services (Spark's default): each host's service opens one connection to the other host where
an environment per task opens one to every task there, and holds one pool of the application's
host memory (``spark.creditflow.hostMemory``) where each task's environment holds its own; a
service SIGKILLed mid-exchange fails that attempt and the retry starts a new one. Spark's own
record of the attempts comes from the application's event log.

One bed and one session serve the whole module; the bed's namespaces and processes are
removed at its end whatever happened. Needs root (skipped with the reason otherwise).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

pytestmark = [pytest.mark.multihost, pytest.mark.spark, pytest.mark.slow]

pytest.importorskip("pyspark")
from pyspark import BarrierTaskContext, TaskContext  # noqa: E402
from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql.types import LongType, StructField, StructType  # noqa: E402

import creditflow as cf  # noqa: E402
import creditflow.spark as cfs  # noqa: E402
import multihost  # noqa: E402
from creditflow.spark._driver import concurrent_slots, host_memory  # noqa: E402
from helpers import poll  # noqa: E402
from netns import Unavailable  # noqa: E402
from spark_data import lineitem, placement  # noqa: E402
from tls_certs import make_tls, tls_kwargs  # noqa: E402

HERE = Path(__file__).resolve().parent
ROWS = 40_000
#: Rows of the fault tests: more than the channels' credit lets through before the tasks stall,
#: so that data is still waiting to cross when the executor dies or the link goes.
FAULT_ROWS = 200_000
IN_FLIGHT_ROWS = 1_000_000
#: The link-cut exchange's ``peer_timeout``, and the most seconds its first failed task may
#: take to show after the cut (under the default ``peer_timeout`` of 30 s).
PEER_TIMEOUT = 4.0
CUT_NOTICED = 25.0
#: How long a stalled first attempt waits for the test before it goes on by itself.
STALL_LIMIT = 120.0
MiB = 1 << 20


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[multihost.Cluster]:
    try:
        with multihost.cluster(tmp_path_factory.mktemp("multihost")) as c:
            yield c
    except Unavailable as exc:
        pytest.skip(f"the multi-host test bed needs network namespaces: {exc}")


@pytest.fixture(scope="module")
def spark(bed: multihost.Cluster) -> Iterator[SparkSession]:
    session = cfs.local_session(bed.master_url, "creditflow-test-multihost", bed.session_conf())
    try:
        poll("every executor registered", lambda: concurrent_slots(session) >= bed.slots, deadline=180)
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="module")
def tls(bed: multihost.Cluster, tmp_path_factory: pytest.TempPathFactory) -> cf.TLSConfig:
    """One certificate for every host of the bed and the driver (they share the filesystem)."""
    addresses = [bed.net.driver_addr, *(h.addr for h in bed.net.hosts.values())]
    return make_tls(tmp_path_factory.mktemp("tls"), "multihost", addresses=addresses)


def host_names(bed: multihost.Cluster) -> dict[int, str]:
    """Host name by network namespace inode (what ``os.stat("/proc/self/ns/net")`` gives)."""
    return {os.stat(f"/run/netns/{h.ns}").st_ino: name for name, h in bed.net.hosts.items()}


def tag_host(column: str) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A ``mapInArrow`` function that appends ``column``: the network namespace (inode) of the
    process it runs in, which names the host."""

    def tag(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        here = os.stat("/proc/self/ns/net").st_ino
        for b in batches:
            yield b.append_column(column, pa.array([here] * b.num_rows, pa.int64()))

    return tag


def with_column(df: DataFrame, name: str) -> StructType:
    """``df``'s schema and a long column ``name``."""
    return StructType([*df.schema.fields, StructField(name, LongType())])


@pytest.mark.parametrize("security", ["secret", "tls"])
def test_exchange_across_hosts_puts_every_row_where_repartition_does(
    spark: SparkSession, bed: multihost.Cluster, tls: cf.TLSConfig, security: str
) -> None:
    df = lineitem(spark, ROWS, bed.slots)
    # Each row is tagged with the host that read it, then the one its exchange task runs on.
    src = df.mapInArrow(tag_host("src"), with_column(df, "src"))
    out = cfs.exchange(
        src,
        "l_orderkey",
        func=tag_host("dst"),
        schema=with_column(src, "dst"),
        tls=tls if security == "tls" else None,
    )
    rows = out.select("*", F.spark_partition_id().alias("p")).collect()
    want = placement(df.repartition(bed.slots, "l_orderkey"))
    assert len(rows) == ROWS
    assert {r["id"]: r["p"] for r in rows} == want
    # The values arrive intact.
    assert sorted(tuple(r)[:-3] for r in rows) == sorted(tuple(r) for r in df.collect())
    names = host_names(bed)
    by_partition = {r["p"]: names[r["dst"]] for r in rows}
    assert sorted(set(by_partition.values())) == ["a", "b"], by_partition
    # Rows crossed both ways between the hosts.
    crossed = {(names[r["src"]], names[r["dst"]]) for r in rows}
    assert {("a", "b"), ("b", "a")} <= crossed


def test_a_certificate_that_does_not_name_the_hosts_is_refused(
    spark: SparkSession, bed: multihost.Cluster, tmp_path: Path
) -> None:
    loopback_only = make_tls(tmp_path, "loopback")  # localhost and 127.0.0.1, not the hosts
    df = lineitem(spark, 1_000, bed.slots)
    with pytest.raises(Exception, match="certificate") as info:
        cfs.exchange(df, "l_orderkey", tls=loopback_only, timeout=30).collect()
    # The failure names a host's address that the certificate does not cover.
    assert any(h.addr in str(info.value) for h in bed.workers), str(info.value)[-3000:]


@contextlib.contextmanager
def remote_consumer(
    bed: multihost.Cluster, report: Path, *extra: str
) -> Iterator[tuple[dict[str, Any], subprocess.Popen[str]]]:
    """``tests/spark_consumer.py`` on host c, unthrottled, writing its report to ``report``:
    its greeting (``address``, ``secret``) and its process, killed if it still runs at the
    end. ``extra``: more of its arguments."""
    client = bed.net.hosts["c"]
    argv = [sys.executable, str(HERE / "spark_consumer.py"), "--out", str(report), "--delay", "0"]
    consumer = subprocess.Popen(
        client.exec(*argv, "--bind", client.addr, *extra), stdout=subprocess.PIPE, text=True
    )
    try:
        assert consumer.stdout is not None
        yield json.loads(consumer.stdout.readline()), consumer
    finally:
        if consumer.poll() is None:
            consumer.kill()
            consumer.wait()
        if consumer.stdout is not None:
            consumer.stdout.close()


def numbered(spark: SparkSession, rows: int, partitions: int) -> DataFrame:
    """``id`` 0 .. rows - 1 and a string made of it."""
    return spark.range(0, rows, numPartitions=partitions).select(
        "id", F.concat(F.lit("row "), F.col("id").cast("string")).alias("s")
    )


@pytest.mark.parametrize("via", ["executors", "driver"])
@pytest.mark.parametrize("security", ["secret", "tls"])
def test_send_streams_to_a_receiver_on_another_host(
    spark: SparkSession, bed: multihost.Cluster, tls: cf.TLSConfig, tmp_path: Path, security: str, via: str
) -> None:
    client = bed.net.hosts["c"]
    report = tmp_path / "report.json"
    extra = []
    if security == "tls":
        t = tls_kwargs(tls)
        extra = ["--tls", str(t["cert"]), str(t["key"]), str(t["ca"])]
    with remote_consumer(bed, report, *extra) as (hello, consumer):
        assert hello["address"].startswith(f"{client.addr}:")
        df = numbered(spark, 100_000, bed.slots)
        stats = cfs.send(
            df, hello["address"], hello["secret"], via=via, tls=tls if security == "tls" else None
        )
        assert consumer.wait(60) == 0
    got = json.loads(report.read_text())
    assert (got["rows"], got["unique_ids"], got["id_sum"]) == (100_000, 100_000, sum(range(100_000)))
    assert len(stats) == (bed.slots if via == "executors" else 1)
    assert all(s["accepted"] for s in stats)


def test_a_monitor_made_on_the_driver_hears_the_tasks_of_every_host(
    spark: SparkSession, bed: multihost.Cluster
) -> None:
    # Made without a host, as on one machine: it must listen where the executors reach the
    # driver (the session's spark.driver.host), not on loopback.
    with cfs.Monitor(interval=0.1) as mon:
        assert mon.handle.address.startswith(f"{bed.net.driver_addr}:")
        df = lineitem(spark, ROWS, bed.slots)
        out = cfs.exchange(df, "l_orderkey", monitor=mon, func=tag_host("dst"), schema=with_column(df, "dst"))
        rows = out.select("dst", F.spark_partition_id().alias("p")).distinct().collect()
        tasks = mon.tasks()
    names = host_names(bed)
    assert sorted(names[r["dst"]] for r in rows) == ["a", "a", "b", "b"]
    # Every task reported, and its last report says it is done, with what it received.
    assert sorted(t.task for t in tasks) == list(range(bed.slots))
    assert all(t.done for t in tasks), tasks
    assert sum(t.rows_received for t in tasks) == ROWS


# ------------------------------------------------------------------------------------ faults


def stall_first_attempt(
    marks: Path, tag: bool = True
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """An exchange ``func`` that appends ``p``, its task's (output partition's) index, and
    whose tasks, until the file ``marks/go`` exists, stop after their first batch (each says
    so with ``marks/started-<p>``) and wait for it: the exchange is in full flight, its
    writers blocked for credit, until the test has done its harm and written ``go``. Tasks
    that start after ``go`` (the retry) go straight through. Without ``tag``, a
    ``mapInArrow`` function before a ``send`` (no barrier; the batches as they are)."""

    def func(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        go = marks / "go"
        stall = not go.exists()
        ctx = BarrierTaskContext.get() if tag else TaskContext.get()
        assert ctx is not None
        me = ctx.partitionId()
        for b in batches:
            yield b.append_column("p", pa.array([me] * b.num_rows, pa.int64())) if tag else b
            if stall:
                stall = False
                (marks / f"started-{me}").touch()
                deadline = time.monotonic() + STALL_LIMIT
                while not go.exists() and time.monotonic() < deadline:
                    time.sleep(0.05)

    return func


def run_in_background(action: Callable[[], Any]) -> Callable[[], Any]:
    """Starts ``action`` in a thread; returns a function that waits for it and returns its
    result or raises its exception."""
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["value"] = action()
        except BaseException as exc:
            result["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()

    def wait() -> Any:
        t.join(600)
        assert not t.is_alive(), "the Spark action did not end within 600 s"
        if "error" in result:
            raise result["error"]
        return result["value"]

    return wait


def faulted_exchange(
    spark: SparkSession,
    bed: multihost.Cluster,
    marks: Path,
    name: str,
    harm: Callable[[], None],
    rows: int = FAULT_ROWS,
    **options: Any,
) -> list[dict[str, Any]]:
    """Runs an exchange that stalls in its first attempt, does ``harm`` once every task is in
    flight (``harm`` lets the tasks go on), checks that every row (after Spark's retries) is in
    the partition ``repartition`` puts it in, and returns what the event log says of the job.
    ``options`` go to ``exchange``."""
    df = lineitem(spark, rows, bed.slots)
    want = placement(df.repartition(bed.slots, "l_orderkey"))
    out = cfs.exchange(
        df,
        "l_orderkey",
        func=stall_first_attempt(marks),
        schema=with_column(df, "p"),
        timeout=120,
        **options,
    )
    sc = spark.sparkContext

    def action() -> dict[int, int]:
        sc.setJobDescription(name)  # a property of this thread's jobs
        # Spark retries a failed barrier stage only when it feeds a shuffle (a failed barrier
        # result stage fails the job): the exchange's rows go through one more.
        got = out.select("id", "p").repartition(1).collect()
        assert len(got) == rows, "a row delivered twice or lost"
        return {r["id"]: r["p"] for r in got}

    wait = run_in_background(action)
    poll("every task of the first attempt in flight", lambda: len(list(marks.glob("started-*"))) == bed.slots)
    harm()
    assert wait() == want
    return bed.job_events(sc.applicationId, name)


def attempts(events: list[dict[str, Any]]) -> list[int]:
    """The stage attempts the events show, in order."""
    submitted = [e for e in events if e["Event"] == "SparkListenerStageSubmitted"]
    return [e["Stage Info"]["Stage Attempt ID"] for e in submitted]


def failures(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The failed tasks' end reasons (killed tasks left out)."""
    ends = [e["Task End Reason"] for e in events if e["Event"] == "SparkListenerTaskEnd"]
    return [r for r in ends if r["Reason"] not in ("Success", "TaskKilled")]


def test_an_executor_killed_during_an_exchange_is_retried_with_the_same_result(
    spark: SparkSession, bed: multihost.Cluster, tmp_path: Path
) -> None:
    killed: list[int] = []

    def kill_executor_on_b() -> None:
        killed.extend(bed.executor_pids("b"))
        assert len(killed) == 1, killed
        os.kill(killed[0], signal.SIGKILL)
        (tmp_path / "go").touch()

    events = faulted_exchange(spark, bed, tmp_path, "exchange, executor killed", kill_executor_on_b)
    assert max(attempts(events)) >= 1
    assert any(f["Reason"] == "ExecutorLostFailure" for f in failures(events)), failures(events)
    # The worker started a new executor in place of the killed one.
    poll("a new executor on b", lambda: bed.executor_pids("b") and bed.executor_pids("b") != killed)


def test_an_executor_killed_during_a_send_is_retried_and_every_row_arrives_once(
    spark: SparkSession, bed: multihost.Cluster, tmp_path: Path
) -> None:
    """Host b's executor is killed while every task is sending to a receiver on host c:
    Spark runs b's tasks again, each retry continues after the rows the receiver has, and
    the consumer gets every row once."""
    report = tmp_path / "report.json"
    with remote_consumer(bed, report) as (hello, consumer):
        df = numbered(spark, FAULT_ROWS, bed.slots)
        df = df.mapInArrow(stall_first_attempt(tmp_path, tag=False), df.schema)
        wait = run_in_background(lambda: cfs.send(df, hello["address"], hello["secret"], timeout=120))
        poll("every task sending", lambda: len(list(tmp_path.glob("started-*"))) == bed.slots)
        killed = bed.executor_pids("b")
        assert len(killed) == 1, killed
        os.kill(killed[0], signal.SIGKILL)
        (tmp_path / "go").touch()
        stats = wait()
        assert consumer.wait(60) == 0
    got = json.loads(report.read_text())
    assert (got["rows"], got["unique_ids"], got["id_sum"]) == (FAULT_ROWS, FAULT_ROWS, sum(range(FAULT_ROWS)))
    assert max(s["attempt"] for s in stats) >= 1, stats
    poll("a new executor on b", lambda: bed.executor_pids("b") and bed.executor_pids("b") != killed)


def test_a_link_cut_during_an_exchange_fails_clearly_and_is_retried_with_the_same_result(
    spark: SparkSession, bed: multihost.Cluster, tmp_path: Path
) -> None:
    tracker = spark.sparkContext.statusTracker()

    def failed_tasks() -> int:
        stages = [tracker.getStageInfo(s) for s in tracker.getActiveStageIds()]
        return sum(s.numFailedTasks + s.currentAttemptId for s in stages if s is not None)

    def cut_until_a_task_fails() -> None:
        bed.net.cut("a", "b")
        try:
            (tmp_path / "go").touch()
            # The exchange's peer_timeout ends the connections over the cut: well before the
            # default's 30 s, or the setting did not reach the host services.
            poll("a task failed by the cut", failed_tasks, deadline=CUT_NOTICED)
        finally:
            bed.net.restore()

    # More rows than the reading side holds (each reading task's link to its host service and
    # its gate buffer a few MiB): with fewer, everything crosses before the cut and nothing fails.
    events = faulted_exchange(
        spark,
        bed,
        tmp_path,
        "exchange, link cut",
        cut_until_a_task_fails,
        rows=IN_FLIGHT_ROWS,
        peer_timeout=PEER_TIMEOUT,
    )
    assert max(attempts(events)) >= 1
    # The first attempt failed with a ConnectionLostError naming the other host.
    lost = [
        f["Description"]
        for f in failures(events)
        if f["Reason"] == "ExceptionFailure" and "ConnectionLostError" in f["Description"]
    ]
    assert lost, failures(events)
    addresses = [bed.net.hosts[h].addr for h in ("a", "b")]
    # Named by whichever end saw it first: "connection to ADDR:..." or "... at ADDR:PORT went away".
    assert any(f"{a}:" in d for d in lost for a in addresses), lost


# ------------------------------------------------------------------------------ host service


def stack_figures() -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """An exchange ``func`` (a closure, so that it travels by value) that appends what the
    task's network stack holds while it reads: ``host`` (network namespace), ``stack`` (the
    service's pid, or the worker's own with an environment per task), ``opened`` (connections
    it opened that are up), ``held`` (bytes its local pools hold) and ``pool`` (its pool's
    bytes)."""

    def figures(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from creditflow.spark import _process

        here = os.stat("/proc/self/ns/net").st_ino
        for b in batches:
            # An environment this task uses; else (a reused worker may keep attachments of
            # earlier exchanges) the service it attached to last.
            envs = [env for env, users in _process._CACHE.envs.values() if users]
            m: dict[str, Any]
            if envs:
                m, stack = dict(envs[0].metrics()), os.getpid()
            else:
                attached = list(_process._ATTACHMENTS.by_name.values())[-1]
                m, stack = dict(attached.metrics()), attached.service_pid
            held = (m["segments_total"] - m["segments_available"]) * m["segment_size"]
            values = {
                "host": here,
                "stack": stack,
                "opened": m["connections_opened"],
                "held": held,
                "pool": m["segments_total"] * m["segment_size"],
            }
            for name, value in values.items():
                b = b.append_column(name, pa.array([value] * b.num_rows, pa.int64()))
            yield b

    return figures


@pytest.mark.parametrize("host_service", [True, False], ids=["service", "per-task"])
def test_the_host_service_opens_one_connection_per_pair_of_hosts_and_keeps_memory_per_host(
    spark: SparkSession, bed: multihost.Cluster, host_service: bool
) -> None:
    df = lineitem(spark, ROWS, bed.slots)
    schema = StructType(
        [
            *df.schema.fields,
            *(StructField(c, LongType()) for c in ("host", "stack", "opened", "held", "pool")),
        ]
    )
    memory = 8 << 20
    out = cfs.exchange(
        df, "l_orderkey", func=stack_figures(), schema=schema, memory=memory, host_service=host_service
    )
    rows = out.select("*", F.spark_partition_id().alias("p")).collect()
    # The same rows where repartition puts them, either way.
    assert len(rows) == ROWS
    assert {r["id"]: r["p"] for r in rows} == placement(df.repartition(bed.slots, "l_orderkey"))
    names = host_names(bed)
    stacks: dict[str, dict[int, dict[str, int]]] = {}
    for r in rows:
        s = stacks.setdefault(names[r["host"]], {}).setdefault(
            r["stack"], {"opened": 0, "held": 0, "pool": 0}
        )
        for k in ("opened", "held", "pool"):
            s[k] = max(s[k], r[k])
    print(f"host_service={host_service}: {stacks}")
    assert sorted(stacks) == ["a", "b"]
    per_host = bed.cores  # the exchange's tasks on each host
    for host, by_stack in stacks.items():
        opened = sum(s["opened"] for s in by_stack.values())
        pool = sum(s["pool"] for s in by_stack.values())
        held = sum(s["held"] for s in by_stack.values())
        if host_service:
            # One service per host: one pool, one connection to the other host.
            assert len(by_stack) == 1, by_stack
            assert opened == 1, (host, by_stack)
        else:
            # A stack per task, each with a connection to every other task (the one of its own
            # host carries its shared-memory link).
            assert len(by_stack) == per_host, by_stack
            assert opened == per_host * (bed.slots - 1), (host, by_stack)
        if host_service:
            # Whatever the exchange's per-task memory: the application's host memory (64 MiB per
            # task slot of a host by default).
            assert pool == host_memory(spark) == 64 * MiB * bed.cores, (host, by_stack)
        else:
            assert pool == memory * per_host, (host, by_stack)
        assert held <= pool


def test_a_host_service_killed_during_an_exchange_is_retried_with_no_row_twice(
    spark: SparkSession, bed: multihost.Cluster, tmp_path: Path
) -> None:
    killed: list[int] = []

    def kill_service_on_b() -> None:
        # Every service of b: the exchange's, and any an earlier test with other network
        # settings (the link cut's peer_timeout) left running until its idle timeout.
        killed.extend(pid for pid in bed.net.hosts["b"].pids() if b"creditflow\0serve\0" in _cmdline(pid))
        assert killed, "no host service runs on b"
        for pid in killed:
            os.kill(pid, signal.SIGKILL)
        (tmp_path / "go").touch()

    # As for the link cut: more rows than the reading side holds, so the service has some to move.
    events = faulted_exchange(
        spark, bed, tmp_path, "exchange, host service killed", kill_service_on_b, rows=IN_FLIGHT_ROWS
    )
    assert max(attempts(events)) >= 1
    lost = [f["Description"] for f in failures(events) if "ConnectionLostError" in f.get("Description", "")]
    assert lost, failures(events)
    # The retry started a new service on b.
    assert any(b"creditflow\0serve\0" in _cmdline(p) and p not in killed for p in bed.net.hosts["b"].pids())


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
