"""creditflow.spark: exchange() against Spark's own repartition, failures, reuse of workers,
and streaming a DataFrame out of Spark to a consumer process.

The local[2] tests share one session. Partition placement is checked row by row: every row
carries a unique id, and the partition Spark's ``repartition(n, key)`` puts it in is joined
with the partition exchange() put it in.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import creditflow as cf
from creditflow.metrics import level_of

pytestmark = pytest.mark.spark

pyspark = pytest.importorskip("pyspark")
from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

import creditflow.spark as cfs  # noqa: E402
from creditflow.spark._driver import HOST_MEMORY_CONF, is_connect  # noqa: E402
from helpers import poll  # noqa: E402
from spark_data import placement  # noqa: E402

HERE = Path(__file__).resolve().parent
#: The host memory of this module's Spark applications.
HOST_MEMORY = "32MiB"


@pytest.fixture(scope="module", params=["classic", "connect"])
def spark(request: pytest.FixtureRequest) -> Iterator[SparkSession]:
    """Every test here runs on a classic session, then on a Spark Connect one (a local Connect
    server in this process). pytest groups the tests by this module-scoped parameter, so the
    classic session is stopped before the Connect server starts: the two cannot share a
    process (the server is a SparkContext of its own)."""
    session = cfs.local_session(
        "local[2]",
        "creditflow-test-exchange",
        {
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.driver.memory": "1g",
            # Smaller than the default (64 MiB per task slot) so that the sends and exchanges
            # here are several times the host's memory, as the tests' tasks' own memory is.
            HOST_MEMORY_CONF: HOST_MEMORY,
        },
        connect=request.param == "connect",
    )
    try:
        yield session
    finally:
        session.stop()


def num_partitions(df: DataFrame) -> int:
    """``df.rdd.getNumPartitions()``, also on Connect (where there is no ``rdd``): the partitions
    that hold rows."""
    row = df.select(F.spark_partition_id().alias("p")).agg(F.max("p").alias("p")).first()
    assert row is not None
    return int(row["p"]) + 1


def lineitem(spark: SparkSession, rows: int, partitions: int, seed: int = 7) -> DataFrame:
    """TPC-H lineitem rows (the spec's column types: decimals, dates, strings), generated
    locally with numpy and a fixed seed, with a unique ``id``."""
    rng = np.random.default_rng(seed)
    orderkey = rng.integers(1, rows // 4 + 2, rows)
    d = decimal.Decimal
    table = pa.table(
        {
            "id": pa.array(np.arange(rows, dtype=np.int64)),
            "l_orderkey": pa.array(orderkey, pa.int64()),
            "l_partkey": pa.array(rng.integers(1, 200_000, rows), pa.int64()),
            "l_linenumber": pa.array(rng.integers(1, 8, rows), pa.int32()),
            "l_quantity": pa.array([d(int(q)) for q in rng.integers(1, 51, rows)], pa.decimal128(12, 2)),
            "l_extendedprice": pa.array(
                [d(int(c)).scaleb(-2) for c in rng.integers(90_000, 10_500_000, rows)], pa.decimal128(12, 2)
            ),
            "l_discount": pa.array(
                [d(int(c)).scaleb(-2) for c in rng.integers(0, 11, rows)], pa.decimal128(12, 2)
            ),
            "l_returnflag": pa.array(rng.choice(["A", "N", "R"], rows)),
            "l_shipdate": pa.array(
                [dt.date(1992, 1, 2) + dt.timedelta(days=int(x)) for x in rng.integers(0, 2526, rows)],
                pa.date32(),
            ),
            "l_shipmode": pa.array(
                rng.choice(["AIR", "MAIL", "RAIL", "SHIP", "TRUCK", "REG AIR", "FOB"], rows)
            ),
            "l_comment": pa.array(
                ["".join(rng.choice(list("abcdefgh éü"), int(k))) for k in rng.integers(10, 44, rows)]
            ),
        }
    )
    return spark.createDataFrame(table).repartition(partitions)


# -------------------------------------------------------------------------------------- exchange


def test_exchange_puts_lineitem_rows_where_spark_repartition_does(spark: SparkSession) -> None:
    df = lineitem(spark, 20_000, 2).cache()
    want = placement(df.repartition(2, "l_orderkey"))
    out = cfs.exchange(df, "l_orderkey")
    assert out.schema == df.schema
    got = placement(out)
    assert len(got) == len(want) == 20_000
    assert got == want
    # The values themselves arrive intact (decimals, dates, strings).
    key = ["id"]
    assert out.sort(*key).collect() == df.sort(*key).collect()


@pytest.mark.parametrize(
    ("keys", "make"),
    [
        (["s"], lambda c: F.concat(F.lit("k"), (c % 97).cast("string"))),
        (["d"], lambda c: (c % 13).cast("double") / 7),
        (["k1", "k2"], None),
    ],
    ids=["string", "double", "two-columns"],
)
def test_exchange_matches_repartition_for_key_types(spark: SparkSession, keys: list[str], make: Any) -> None:
    base = spark.range(0, 30_000, numPartitions=2)
    if make is None:
        df = base.select(
            "id",
            (F.col("id") % 7).alias("k1"),
            F.when(F.col("id") % 5 == 0, None).otherwise(F.col("id") % 11).alias("k2"),
        )
    else:
        df = base.select(
            "id", F.when(F.col("id") % 10 == 0, None).otherwise(make(F.col("id"))).alias(keys[0])
        )
    assert placement(cfs.exchange(df, keys)) == placement(df.repartition(2, *keys))


def test_func_aggregates_each_partition_without_a_second_stage(spark: SparkSession) -> None:
    df = spark.range(0, 50_000, numPartitions=2).select(
        (F.col("id") % 101).alias("k"), F.col("id").alias("v")
    )

    def totals(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        received = list(batches)
        if not received:
            return
        agg = pa.Table.from_batches(received).group_by("k").aggregate([("v", "sum"), ("v", "count")])
        yield from agg.rename_columns(["k", "total", "n"]).to_batches()

    out = cfs.exchange(df, "k", func=totals, schema="k long, total long, n long")
    got = {r["k"]: (r["total"], r["n"]) for r in out.collect()}
    want = {
        r["k"]: (r["total"], r["n"])
        for r in df.groupBy("k").agg(F.sum("v").alias("total"), F.count("v").alias("n")).collect()
    }
    # Every key was complete in one partition: one output row per key, none split.
    assert got == want
    assert out.count() == 101


def test_small_input_batches_reach_each_task_merged_not_as_pieces_of_a_few_rows(spark: SparkSession) -> None:
    # Spark hands the exchange batches of 100 rows: split two ways, each would reach a task as
    # two pieces of about 50 rows (up to 400 pieces a task). The writers merge them first, so
    # that a write gives each task about 1,024 rows.
    rows = 40_000
    df = spark.range(0, rows, numPartitions=2).select("id", (F.col("id") % 101).alias("k"))

    def counted(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        n = got = 0
        for b in batches:
            n += 1
            got += b.num_rows
        yield pa.record_batch({"batches": [n], "rows": [got]})

    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    try:
        tasks = cfs.exchange(df, "k", func=counted, schema="batches long, rows long").collect()
        placed = placement(cfs.exchange(df, "k"))
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert sum(t["rows"] for t in tasks) == rows
    # Each task's 20,000 input rows go out in writes of at least 2 x 1,024 rows (the last
    # excepted): at most 10 writes, so at most 10 pieces from each of the two tasks.
    assert all(1 <= t["batches"] <= 20 for t in tasks), tasks
    assert placed == placement(df.repartition(2, "k"))


def test_map_in_arrow_right_after_exchange_runs_in_the_exchange_s_tasks(
    spark: SparkSession, capsys: pytest.CaptureFixture[str]
) -> None:
    """``exchange(df, k).mapInArrow(f)`` is fused: the plan has one Python pass (the
    exchange's barrier stage runs ``f``), ``f`` runs after ``func`` when there is one, and the
    rows are those of the unfused plan."""
    df = spark.range(0, 20_000, numPartitions=2).select((F.col("id") % 31).alias("k"), F.col("id").alias("v"))
    schema = "rows long, total long"

    def count(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        got = list(batches)
        yield pa.RecordBatch.from_pydict(
            {
                "rows": [sum(b.num_rows for b in got)],
                "total": [sum(pc.sum(b.column("v")).as_py() or 0 for b in got)],
            },
            schema=pa.schema([("rows", pa.int64()), ("total", pa.int64())]),
        )

    def odd_only(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            yield b.filter(pc.equal(pc.bit_wise_and(b.column("v"), 1), 1))

    def python_passes(out: DataFrame) -> int:
        capsys.readouterr()
        out.explain()
        return capsys.readouterr().out.count("MapInArrow")

    def rows(out: DataFrame) -> list[tuple[int, int]]:
        return sorted((r["rows"], r["total"]) for r in out.collect())

    fused = cfs.exchange(df, "k").mapInArrow(count, schema)
    # The same function after a plain DataFrame step is a second Python pass.
    unfused = cfs.exchange(df, "k").select("k", "v").mapInArrow(count, schema)
    assert (python_passes(fused), python_passes(unfused)) == (1, 2)
    assert rows(fused) == rows(unfused)
    assert sum(n for n, _ in rows(fused)) == 20_000
    # After func, and chained again: each function sees what the one before it yields.
    chained = cfs.exchange(df, "k", func=odd_only).mapInArrow(odd_only, df.schema).mapInArrow(count, schema)
    assert python_passes(chained) == 1
    assert sum(n for n, _ in rows(chained)) == 10_000


def test_num_partitions_other_than_the_input_s(spark: SparkSession) -> None:
    df = spark.range(0, 5_000, numPartitions=2).select("id", (F.col("id") % 17).alias("k"))
    out = cfs.exchange(df, "k", num_partitions=1)
    assert num_partitions(out) == 1
    assert sorted(r["id"] for r in out.collect()) == list(range(5_000))


def test_too_few_slots_fails_at_once_naming_both_numbers(spark: SparkSession) -> None:
    df = spark.range(0, 10, numPartitions=3)
    start = time.monotonic()
    with pytest.raises(ValueError, match=r"needs 3 task slots .* has 2") as info:
        cfs.exchange(df, "id").collect()
    assert "num_partitions=2" in str(info.value)
    assert time.monotonic() - start < 60  # not Spark's ten-minute barrier wait


def test_bad_arguments_are_refused_on_the_driver(spark: SparkSession) -> None:
    df = spark.range(0, 10, numPartitions=2)
    with pytest.raises(ValueError, match="not in the DataFrame"):
        cfs.exchange(df, "nope")
    with pytest.raises(ValueError, match="at least one key"):
        cfs.exchange(df, [])
    with pytest.raises(ValueError, match="cannot exchange by .*cannot hash a key column of type List"):
        cfs.exchange(df.select("id", F.array("id").alias("a")), "a")
    with pytest.raises(cf.InsufficientBuffersError, match="needs at least 6 segments per task"):
        cfs.exchange(df, "id", memory="128KiB", host_service=False)
    with pytest.raises(ValueError, match="num_partitions"):
        cfs.exchange(df, "id", num_partitions=0)
    with pytest.raises(ValueError, match="rendezvous must be one of"):
        cfs.exchange(df, "id", rendezvous="carrier-pigeon")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match='memory: invalid byte size "lots"'):
        cfs.exchange(df, "id", memory="lots")
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        cfs.exchange(df, "id", timeout=0)


def _services_named(name: str) -> list[int]:
    """The pids of the creditflow processes serving the host service ``name`` on this machine."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"serve" in argv and name.encode() in argv:
                pids.append(int(entry.name))
    return pids


def test_one_host_service_with_the_application_s_host_memory_serves_exchanges_of_any_size(
    spark: SparkSession,
) -> None:
    """Exchanges of different sizes and per-task ``memory`` share one service per host and
    application, whose one pool is the application's host memory (the session's setting);
    the setting is read once per application."""
    from creditflow.spark import _driver, _process
    from creditflow.spark.exchange import _app_secret

    app = _driver.application_id(spark)
    memory = _driver.host_memory(spark)
    assert memory == cf.parse_bytes(HOST_MEMORY)
    settings = _process.EnvSettings(secret=_app_secret(app))
    name = _process.service_name(app, _process.service_settings(settings, "127.0.0.1", memory))
    df = spark.range(0, 5_000, numPartitions=2).select("id", (F.col("id") % 31).alias("k"))
    pids = set()
    for n, task_memory in ((2, "8MiB"), (1, "32MiB"), (2, "64MiB")):
        out = cfs.exchange(df, "k", num_partitions=n, memory=task_memory)
        assert sorted(r["id"] for r in out.collect()) == list(range(5_000))
        pids.update(_services_named(name))
    assert len(pids) == 1, pids
    with cf.attach(name) as probe:
        m = probe.metrics()
        assert probe.service_pid in pids
    assert m["segments_total"] * m["segment_size"] == memory
    # Read once: another value later is refused on the driver, naming the setting; so is a
    # value that is not a size.
    for value, error in (("1GiB", "read once per application"), ("lots", "must be a size")):
        spark.conf.set(_driver.HOST_MEMORY_CONF, value)
        try:
            with pytest.raises(ValueError, match=error):
                cfs.exchange(df, "k")
        finally:
            spark.conf.set(_driver.HOST_MEMORY_CONF, HOST_MEMORY)
    assert placement(cfs.exchange(df, "k")) == placement(df.repartition(2, "k"))


def test_tasks_meet_through_the_driver_or_allgather_and_take_their_settings(spark: SparkSession) -> None:
    """Classic sessions default to the driver's rendezvous and can choose Spark's allGather;
    Connect sessions use allGather and refuse the driver's (their client may be unreachable)."""
    df = spark.range(0, 5_000, numPartitions=2).select("id", (F.col("id") % 97).alias("k")).cache()
    want = placement(df.repartition(2, "k"))
    choices: list[Any] = [None, "barrier"]
    if is_connect(spark):
        with pytest.raises(ValueError, match="needs a classic session"):
            cfs.exchange(df, "k", rendezvous="driver")
    else:
        choices.append("driver")
    for choice in choices:
        assert placement(cfs.exchange(df, "k", rendezvous=choice)) == want, choice
    # Compressed, and over loopback TCP instead of shared memory: the same rows in the same places.
    assert placement(cfs.exchange(df, "k", wire_compression="lz4", shared_memory=False)) == want
    with pytest.raises(ValueError, match="wire_compression must be"):
        cfs.exchange(df, "k", wire_compression="gzip")
    with pytest.raises(ValueError, match="peer_timeout must be a non-negative number of seconds"):
        cfs.exchange(df, "k", peer_timeout=-1)


def test_failed_task_fails_its_peers_and_the_retried_stage_is_clean(
    spark: SparkSession, tmp_path: Path
) -> None:
    df = spark.range(0, 40_000, numPartitions=2).select("id", (F.col("id") % 1000).alias("k"))
    marker = tmp_path / "failed-once"

    def fail_once(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        for batch in batches:
            if ctx is not None and ctx.partitionId() == 0 and not marker.exists():
                marker.touch()
                raise RuntimeError("injected failure in task 0")
            yield batch

    out = cfs.exchange(df, "k", func=fail_once)
    # Spark retries a failed barrier stage when it feeds a shuffle (here the aggregation);
    # a barrier *result* stage (collect() right after the exchange) fails the job instead.
    total = out.agg(
        F.count("id").alias("n"), F.sum("id").alias("s"), F.countDistinct("id").alias("d")
    ).first()
    assert total is not None
    assert (total["n"], total["d"], total["s"]) == (40_000, 40_000, sum(range(40_000)))
    assert marker.exists()  # the first attempt did fail, and the barrier retry re-ran the stage
    _assert_workers_clean(spark)


def test_failure_without_retry_names_the_cause(spark: SparkSession) -> None:
    df = spark.range(0, 1_000, numPartitions=2).select("id", (F.col("id") % 10).alias("k"))

    def always_fail(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for _ in batches:
            raise RuntimeError("the user's function broke")
        yield from ()

    with pytest.raises(Exception, match="the user's function broke"):
        cfs.exchange(df, "k", func=always_fail).collect()
    _assert_workers_clean(spark)


@pytest.mark.parametrize("host_service", [False, True], ids=["own-env", "host-service"])
def test_a_peer_cut_off_by_a_failed_task_raises_the_task_s_cause(
    spark: SparkSession, tmp_path: Path, host_service: bool
) -> None:
    """Task 1's function breaks while its writer is held back by task 0, which has not
    started reading: task 0's reader of task 1's partition is cut off mid-stream and, once it
    reads, must raise task 1's own failure (which Spark may report as the stage's), not the
    release that follows it nor the lost connection of task 1's process, which ends at once.

    Spark ends the Python workers of the stage's other tasks about 2 s
    (``spark.python.task.killTimeout``) after task 1's failure reaches it, which through the
    host service is at once: task 0 reads the moment task 1 starts failing."""
    seen = tmp_path / "task0.txt"
    started = tmp_path / "task0-started"
    failing = tmp_path / "task1-failing"
    reading = tmp_path / "task0-reading"
    df = spark.range(0, 2_000_000, numPartitions=2).select("id", (F.col("id") % 10).alias("k"))

    def one_breaks(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        if TaskContext.get().partitionId() == 1:
            # Task 0's gate exists once its function runs (the exchange creates it first):
            # without this wait a loaded machine could start task 0 after task 1's process,
            # and with it the listener of an environment per task, is gone.
            deadline = time.monotonic() + 60
            while not started.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.5)  # task 0's channel attaches; task 1's writer fills its credit
            failing.touch()
            raise RuntimeError("the user's function broke")
        started.touch()
        deadline = time.monotonic() + 60
        while not failing.exists() and time.monotonic() < deadline:
            time.sleep(0.005)
        reading.touch()
        try:
            for b in batches:
                yield b.slice(0, 0)
        except Exception as exc:
            seen.write_text(f"{type(exc).__name__}: {exc}")
            raise

    with pytest.raises(Exception, match="the user's function broke"):
        cfs.exchange(df, "k", func=one_breaks, memory="4MiB", host_service=host_service).collect()
    try:
        text = poll("task 0's error", lambda: seen.exists() and seen.read_text(), deadline=30)
    except pytest.fail.Exception:
        began = "began" if reading.exists() else "never began"
        pytest.fail(f"task 0's error not seen within 30 s; task 0 {began} to read")
    assert text.startswith("ProducerFailedError"), text
    assert "exchange task 1 failed: RuntimeError: the user's function broke" in text, text


def _assert_workers_clean(spark: SparkSession) -> None:
    """Reused Python workers hold at most the environment of the last exchange (no pile-up of
    environments, listening ports or threads across exchanges and retries)."""
    for _ in range(3):
        df = spark.range(0, 2_000, numPartitions=2).select("id", (F.col("id") % 10).alias("k"))
        assert cfs.exchange(df, "k").count() == 2_000

    def report(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import psutil

        import creditflow.spark as s

        for _ in batches:
            pass
        proc = psutil.Process()
        listening = [c for c in proc.net_connections("tcp") if c.status == psutil.CONN_LISTEN]
        yield pa.RecordBatch.from_pylist(
            [
                {
                    "pid": os.getpid(),
                    "envs": s.open_environments(),
                    "listening": len(listening),
                    "threads": proc.num_threads(),
                }
            ]
        )

    rows = (
        spark.range(0, 8, numPartitions=8)
        .mapInArrow(report, "pid long, envs long, listening long, threads long")
        .collect()
    )
    for r in rows:
        assert r["envs"] <= 1, rows
        assert r["listening"] <= 1 + 1, rows  # one environment's listener (+ the worker's own, if any)


def test_monitor_receives_live_samples_from_every_task(spark: SparkSession) -> None:
    df = spark.range(0, 200_000, numPartitions=2).select("id", (F.col("id") % 100).alias("k"))
    with cfs.Monitor(interval=0.05, metrics=True, web=0) as mon:
        # An environment per task, which each task serves at /metrics (a host service's tasks
        # have none of their own: they send samples only, as checked below for the service).
        assert cfs.exchange(df, "k", monitor=mon, host_service=False).count() == 200_000
        deadline = time.monotonic() + 10
        while len([s for s in mon.tasks() if s.done]) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        final = mon.tasks()
        # The page's data: the two tasks, and the all-to-all between them.
        assert mon.web_url is not None
        with urllib.request.urlopen(mon.web_url + "api/pipeline", timeout=10) as resp:
            graph = json.load(resp)
        job = final[0].job
        assert [n["name"] for n in graph["nodes"]] == ["task 0", "task 1"]
        edges = {(e["source"], e["target"]) for e in graph["edges"]}
        assert edges == {(f"{job}/0", f"{job}/1"), (f"{job}/1", f"{job}/0")}
        # Every task served its environment's /metrics and said where.
        urls = mon.metrics_urls()
        assert len(urls) == 2
        assert all(u.startswith("http://127.0.0.1:") and u.endswith("/metrics") for u in urls)
    assert sorted(s.task for s in final) == [0, 1]
    assert all(s.done for s in final)
    assert sum(s.rows_written for s in final) == 200_000
    assert sum(s.rows_received for s in final) == 200_000
    # Each sample's level is the one its own backpressure share gives.
    assert [s.level for s in final] == [level_of(s.backpressured_ms_per_second / 1000) for s in final]
    # Through the host service: the same samples, and no URL.
    with cfs.Monitor(interval=0.05, metrics=True) as mon:
        assert cfs.exchange(df, "k", monitor=mon).count() == 200_000
        poll("both tasks done", lambda: len([s for s in mon.tasks() if s.done]) == 2, deadline=10)
        final = mon.tasks()
        assert mon.metrics_urls() == []
    assert sum(s.rows_written for s in final) == sum(s.rows_received for s in final) == 200_000
    assert [s.level for s in final] == [level_of(s.backpressured_ms_per_second / 1000) for s in final]


# ----------------------------------------------------------------------------- streaming out


def test_receiver_gets_every_row_once_from_the_executors(spark: SparkSession) -> None:
    df = spark.range(0, 100_000, numPartitions=4).select("id", (F.col("id") * 3).alias("x"))
    with cfs.Receiver(max_queued=2) as rx:
        result: dict[str, Any] = {}
        t = threading.Thread(target=lambda: result.update(stats=cfs.send(df, rx.address, rx.secret)))
        t.start()
        got = list(rx)
        t.join(60)
    ids = pa.concat_arrays([b.column("id") for b in got]).to_numpy()
    assert len(ids) == 100_000
    assert np.array_equal(np.sort(ids), np.arange(100_000))
    stats = result["stats"]
    assert [s["partition"] for s in stats] == [0, 1, 2, 3]
    assert all(s["accepted"] for s in stats)
    assert sum(s["rows"] for s in stats) == 100_000
    # The Arrow bytes the tasks sent: the rows' 16 bytes, and Spark's validity bitmaps (all
    # set, which the wire may leave out) and padding at most.
    received = sum(b.nbytes for b in got)
    assert received >= 16 * 100_000
    assert received <= sum(s["bytes"] for s in stats) <= received * 1.03


def test_receiver_via_driver(spark: SparkSession) -> None:
    df = spark.range(0, 10_000, numPartitions=3)
    with cfs.Receiver() as rx:
        t = threading.Thread(target=cfs.send, args=(df, rx.address, rx.secret), kwargs={"via": "driver"})
        t.start()
        got = pa.Table.from_batches(list(rx))
        t.join(60)
    assert sorted(pc.cast(got.column("id"), pa.int64()).to_pylist()) == list(range(10_000))


def test_failed_job_makes_the_receiver_raise(spark: SparkSession) -> None:
    df = spark.range(0, 1_000, numPartitions=2)

    def broken(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for _ in batches:
            raise RuntimeError("the source broke")
        yield from ()

    failing = df.mapInArrow(broken, df.schema)
    with cfs.Receiver(timeout=120) as rx:
        errors: list[BaseException] = []

        def run() -> None:
            try:
                cfs.send(failing, rx.address, rx.secret)
            except BaseException as exc:
                errors.append(exc)

        t = threading.Thread(target=run)
        t.start()
        with pytest.raises(cf.CreditflowError, match="the source broke"):
            for _ in rx:
                pass
        t.join(60)
    assert len(errors) == 1
    assert "the source broke" in str(errors[0])


def test_throttled_consumer_outside_spark_bounds_executor_memory(spark: SparkSession, tmp_path: Path) -> None:
    """A consumer in another process reads slowly: every row arrives once, backpressure
    reaches the executors, and the tasks' creditflow memory and process RSS stay bounded
    although the DataFrame is several times larger."""
    rows = 6_000_000  # 3 x 8 B columns: ~144 MB of Arrow data, 72 MB per task
    out = tmp_path / "consumer.json"
    with subprocess.Popen(
        [sys.executable, str(HERE / "spark_consumer.py"), "--out", str(out), "--delay", "0.01"],
        stdout=subprocess.PIPE,
        text=True,
    ) as consumer:
        try:
            assert consumer.stdout is not None
            where = json.loads(consumer.stdout.readline())
            df = spark.range(0, rows, numPartitions=2).select(
                "id", (F.col("id") * 3).alias("x"), F.rand(3).alias("r")
            )
            with cfs.Monitor(interval=0.1) as mon:
                stats = cfs.send(df, where["address"], where["secret"], memory="16MiB", monitor=mon)
                samples = mon.samples()
            assert consumer.wait(timeout=120) == 0
        finally:
            consumer.kill()
    report = json.loads(out.read_text())
    assert report["rows"] == rows
    assert report["unique_ids"] == rows
    assert sum(s["rows"] for s in stats) == rows
    # Backpressure reached the tasks: they spent most of some second waiting for credit ...
    assert max(s.backpressured_ms_per_second for s in samples) > 500
    # ... while their out-pools never held more than the 16 MiB they were given, and no
    # worker grew by anything near its 72 MB share of the data.
    assert max(s.out_pool_usage for s in samples) <= 1.0
    growth = max(s.rss_bytes - s.rss_start_bytes for s in samples)
    assert growth < 48 * 1024 * 1024, growth


def numbers(spark: SparkSession, rows: int, partitions: int, seed: int) -> DataFrame:
    """``id``, ``x = 3 * id`` and a random double: 24 bytes of Arrow data per row."""
    return spark.range(0, rows, numPartitions=partitions).select(
        "id", (F.col("id") * 3).alias("x"), F.rand(seed).alias("r")
    )


def test_spilling_receiver_lets_the_job_finish_before_a_throttled_consumer(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Receiver(spill=True): the receiver reads the tasks at Spark's speed and spills what its
    throttled consumer has not taken yet, so send() (the job's action) returns while the
    consumer is still reading; then every row arrives once, the store stays within the
    receiver's memory, the tasks within theirs, and close() removes the spill file."""
    rows = 2_000_000  # 3 x 8 B columns: ~48 MB of Arrow data into 8 MiB of receiver memory
    memory = 8 << 20
    df = numbers(spark, rows, 4, seed=3)
    ids: list[np.ndarray[Any, Any]] = []
    xs: list[np.ndarray[Any, Any]] = []
    sent = threading.Event()
    result: dict[str, Any] = {}
    with cfs.Receiver(spill=True, memory=memory, spill_dir=str(tmp_path), timeout=240) as rx:

        def run() -> None:
            try:
                with cfs.Monitor(interval=0.1) as mon:
                    result["stats"] = cfs.send(df, rx.address, rx.secret, memory="16MiB", monitor=mon)
                    result["samples"] = mon.samples()
            finally:
                result["consumed_when_sent"] = len(ids)
                sent.set()

        t = threading.Thread(target=run)
        t.start()
        peak_allocated = peak_store = 0
        listed = False
        for batch in rx:
            ids.append(batch.column("id").to_numpy().copy())
            xs.append(batch.column("x").to_numpy().copy())
            m = rx.metrics()
            store = rx.spill_metrics()
            assert store is not None
            peak_allocated = max(peak_allocated, m["segments_allocated"])
            peak_store = max(peak_store, store["memory_segments"])
            listed = listed or any(p["spill"] is not None for p in m["partitions"].values())
            if len(ids) == 3:
                # The consumer pauses until the job is done: that happens only if the tasks
                # do not wait for it. What it has not read is on disk meanwhile.
                assert sent.wait(240), "send() waited for the consumer"
                assert list(tmp_path.rglob("*.spill")), "the receiver spilled"
            time.sleep(0.005)  # the throttle
        t.join(60)
        store = rx.spill_metrics()
        assert store is not None
        total_segments = rx.metrics()["segments_total"]
    assert not list(tmp_path.rglob("*.spill")), "the spill file is gone"
    # The job finished while the consumer had taken 3 of its batches.
    assert result["consumed_when_sent"] <= 3 < len(ids), (result["consumed_when_sent"], len(ids))
    stats = result["stats"]
    assert [s["partition"] for s in stats] == [0, 1, 2, 3]
    assert all(s["accepted"] for s in stats)
    # Every row once, unchanged.
    got_ids, got_xs = np.concatenate(ids), np.concatenate(xs)
    assert len(got_ids) == rows
    assert np.array_equal(np.sort(got_ids), np.arange(rows))
    assert np.array_equal(got_xs, got_ids * 3)
    # Memory: the environment never allocated beyond its memory, and the store held at most
    # that while a stream several times larger went through it; the rest went to disk.
    assert peak_allocated <= total_segments == memory // (32 << 10)
    assert 0 < peak_store <= total_segments
    assert store["stream_bytes"] > 4 * memory, store
    assert store["spilled_bytes"] > 0, store
    assert listed, "rx.metrics() lists the receiver's store among its partitions"
    # The tasks: their out-pools never held more than the 16 MiB each was given, and no worker
    # grew by more than that plus interpreter slack (the receiver, not the tasks, holds what
    # the consumer has not read).
    samples = result["samples"]
    assert samples
    assert max(s.out_pool_usage for s in samples) <= 1.0
    growth = max(s.rss_bytes - s.rss_start_bytes for s in samples)
    assert growth < 48 * 1024 * 1024, growth


def test_spilling_receiver_replays_the_dataframe_for_each_epoch(spark: SparkSession, tmp_path: Path) -> None:
    """With epochs=2 one iteration reads the whole DataFrame twice, in the same order, and a
    new iteration starts from the start again; Spark computed it once."""
    rows = 300_000  # ~7 MB of Arrow data: more than the receiver's 4 MiB, so part is read back
    df = numbers(spark, rows, 3, seed=5)
    result: dict[str, Any] = {}
    with cfs.Receiver(spill=True, epochs=2, memory="4MiB", spill_dir=str(tmp_path), timeout=240) as rx:
        t = threading.Thread(target=lambda: result.update(stats=cfs.send(df, rx.address, rx.secret)))
        t.start()
        first = np.concatenate([b.column("id").to_numpy().copy() for b in rx])
        t.join(60)
        again = np.concatenate([b.column("id").to_numpy().copy() for b in rx])
        store = rx.spill_metrics()
    assert store is not None
    assert len(first) == 2 * rows
    assert np.array_equal(np.sort(first[:rows]), np.arange(rows)), "epoch 1: every row once"
    assert np.array_equal(first[rows:], first[:rows]), "epoch 2: the same rows, in the same order"
    assert np.array_equal(again, first), "a new iteration starts from the first batch again"
    assert store["replay"]
    assert store["read_back_bytes"] > 0, store
    stats = result["stats"]
    assert [s["partition"] for s in stats] == [0, 1, 2], "each partition was computed and sent once"
    assert sum(s["rows"] for s in stats) == rows


def test_spilling_receiver_without_replay_at_max_spill_holds_the_tasks_back(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Without replay, max_spill turns spilling back into backpressure: the receiver holds at
    most its memory plus max_spill, so when the job's action returns the consumer has read
    all but that much; nothing fails and every row arrives once."""
    rows = 2_000_000  # ~48 MB of Arrow data through 4 MiB of memory + 1 MiB of disk
    df = numbers(spark, rows, 3, seed=9)
    ids: list[np.ndarray[Any, Any]] = []
    result: dict[str, Any] = {}
    with cfs.Receiver(
        spill=True, memory="4MiB", spill_dir=str(tmp_path), max_spill="1MiB", timeout=240
    ) as rx:

        def run() -> None:
            try:
                result["stats"] = cfs.send(df, rx.address, rx.secret, timeout=240)
            finally:
                result["consumed_when_sent"] = sum(len(a) for a in ids)

        t = threading.Thread(target=run)
        t.start()
        peak_disk = 0
        for batch in rx:
            ids.append(batch.column("id").to_numpy().copy())
            store = rx.spill_metrics()
            assert store is not None
            peak_disk = max(peak_disk, store["disk_bytes"])
            time.sleep(0.002)
        t.join(60)
    got = np.concatenate(ids)
    assert np.array_equal(np.sort(got), np.arange(rows))
    assert sum(s["rows"] for s in result["stats"]) == rows
    assert peak_disk <= 1 << 20
    # What the receiver may hold when the job ends: its 4 MiB, 1 MiB on disk, and (generously)
    # as much again in its channels: 8 MiB of 24-byte rows.
    assert result["consumed_when_sent"] >= rows - (8 << 20) // 24, result["consumed_when_sent"]


def test_spilling_receiver_with_replay_at_max_spill_fails_clearly(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A replaying receiver cannot drop what it keeps: at max_spill its store fails with the
    SpillError's message (naming max_spill), the consumer gets ProducerFailedError after the
    batches before, and the job fails with that message instead of reporting a delivery."""
    rows = 600_000  # ~14 MB of Arrow data into 4 MiB of memory + 2 MiB of disk
    df = numbers(spark, rows, 3, seed=7)
    errors: list[BaseException] = []
    with cfs.Receiver(
        spill=True, replay=True, memory="4MiB", spill_dir=str(tmp_path), max_spill="2MiB", timeout=240
    ) as rx:

        def run() -> None:
            try:
                cfs.send(df, rx.address, rx.secret, timeout=240)
            except BaseException as exc:
                errors.append(exc)

        t = threading.Thread(target=run)
        t.start()
        got: list[int] = []

        def consume() -> None:
            for batch in rx:
                got.append(batch.num_rows)

        with pytest.raises(cf.ProducerFailedError, match="max_spill"):
            consume()
        assert sum(got) < rows
        t.join(240)
        assert not t.is_alive()
    assert len(errors) == 1, "the job failed instead of reporting a delivery"
    assert "max_spill" in str(errors[0])
    assert not list(tmp_path.rglob("*.spill"))
