"""Driver-side checks before a creditflow job starts: the Python the workers run, free slots,
the number of partitions. Each works on a classic session and on a Spark Connect one.

A Spark Connect session (PySpark's client mode: ``SparkSession.builder.remote(...)``,
``pyspark-client``, most managed platforms) has no ``SparkContext``, ``_jsc``, ``_jvm`` or
``rdd`` on the driver: there, the number of partitions comes from a small probe job, the
number of task slots from the session's configuration (``spark.master``...), and a worker
Python without creditflow is reported by that probe.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import DataFrame, SparkSession

if TYPE_CHECKING:  # pyspark-client (Connect only) has no SparkContext to import
    from pyspark import SparkContext

#: How long to wait for executors to register before saying there are too few slots
#: (a local-cluster or a real cluster registers its executors after the session starts).
REGISTRATION_WAIT = 30.0

_LOCAL = re.compile(r"local(?:\[(\d+|\*)(?:,\s*\d+)?\])?")
_LOCAL_CLUSTER = re.compile(r"local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*\d+\s*\]")


def is_connect(spark: Any) -> bool:
    """True for a Spark Connect session (or one of its DataFrames' sessions): no SparkContext,
    no JVM on the driver. Looks at the class, so it imports nothing of Spark Connect."""
    return type(spark).__module__.startswith("pyspark.sql.connect.")


def driver_host() -> str | None:
    """Where Spark's executors reach this process: ``spark.driver.host`` of the classic
    SparkContext running here (Spark's own RPC address for them), or None when there is none
    (none started yet, or only a Spark Connect client, which executors may not reach)."""
    try:
        from pyspark import SparkContext
    except ImportError:  # pyspark-client: Connect only
        return None
    sc = getattr(SparkContext, "_active_spark_context", None)
    if sc is None:
        return None
    host = sc.getConf().get("spark.driver.host")
    return str(host) if host else None


def ensure_python(sc: SparkContext) -> None:
    """Makes Spark's Python workers run this interpreter when nobody chose one (classic sessions).

    Without ``PYSPARK_PYTHON`` Spark starts ``python3`` from PATH, which is often an
    interpreter without creditflow (or pyarrow); the first task then fails with an
    ImportError far from its cause.
    """
    if os.environ.get("PYSPARK_PYTHON"):
        return
    os.environ["PYSPARK_PYTHON"] = sys.executable
    # Functions created from now on carry the context's pythonExec to the executors.
    if getattr(sc, "pythonExec", None) in (None, "python3", "python"):
        sc.pythonExec = sys.executable


def prepare(df: DataFrame) -> int:
    """Readies ``df``'s session for a creditflow job and returns ``df``'s number of partitions.

    Classic: sets the workers' Python when unset (:func:`ensure_python`) and asks the RDD.
    Connect: runs a probe job over ``df`` reduced to a constant column (one tiny Python task
    per partition, empty ones included); a worker Python that cannot import creditflow fails
    there, with what to do, instead of in the job.
    """
    spark = df.sparkSession
    if not is_connect(spark):
        ensure_python(spark.sparkContext)
        return int(df.rdd.getNumPartitions())
    from pyspark.sql import functions as F

    probe = df.select(F.lit(0).alias("_creditflow_probe")).mapInArrow(_partition_ids, "partition long")
    try:
        rows = probe.collect()
    except Exception as exc:
        _explain_worker_python(exc)
        raise
    return len({r["partition"] for r in rows})


def _partition_ids(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The probe's task: one row, its partition's index (Python runs for empty partitions too)."""
    for _ in batches:
        pass
    ctx = TaskContext.get()
    assert ctx is not None, "runs inside a Spark task"
    yield pa.RecordBatch.from_pylist(
        [{"partition": ctx.partitionId()}], schema=pa.schema([("partition", pa.int64())])
    )


def _explain_worker_python(exc: BaseException) -> None:
    """Raises a RuntimeError saying how to fix it when ``exc`` is a worker's failed import of
    creditflow or pyarrow, or a worker Python of another version (a Connect server whose
    ``PYSPARK_PYTHON`` is another interpreter)."""
    text = str(exc)
    problems = {f"cannot import {m}": f"No module named '{m}" for m in ("creditflow", "pyarrow")}
    problems["run another Python version than this client"] = "PYTHON_VERSION_MISMATCH"
    for problem, sign in problems.items():
        if sign in text:
            raise RuntimeError(
                f"Spark's Python workers {problem}: the Spark Connect server starts them "
                "with its own PYSPARK_PYTHON (python3 from PATH when unset), which the client cannot "
                "change. Start the server with PYSPARK_PYTHON set to an interpreter that has creditflow "
                "(creditflow.spark.local_session(connect=True) does for a local server), or ship "
                "creditflow to the executors (spark.archives with a packed virtual environment)."
            ) from exc


def concurrent_slots(spark: SparkSession) -> int:
    """How many tasks the cluster runs at once (what a barrier stage needs as many of as it has
    tasks). Classic: Spark's own count when it can be asked, else ``defaultParallelism``.
    Connect: from the configuration (:func:`_configured_slots`), else the default parallelism
    a small SQL probe reveals."""
    if is_connect(spark):
        slots = _configured_slots(spark)
        return slots if slots is not None else _probed_parallelism(spark)
    sc = spark.sparkContext
    jsc: Any = sc._jsc.sc()
    try:
        profile = jsc.resourceProfileManager().defaultResourceProfile()
        return int(jsc.maxNumConcurrentTasks(profile))
    except Exception:  # an older or different Spark: fall back to the documented figure
        return int(sc.defaultParallelism)


def _configured_slots(spark: SparkSession) -> int | None:
    """Task slots as the configuration states them: ``local[N]`` -> N, ``local`` -> 1,
    ``local-cluster[W,C,M]`` -> W x C, a cluster with ``spark.executor.instances`` and
    ``spark.executor.cores`` -> their product; each divided by ``spark.task.cpus``. None when
    the configuration does not say (``local[*]``, dynamic allocation...)."""
    conf = spark.conf
    master = (conf.get("spark.master", "") or "").strip()
    task_cpus = max(int(conf.get("spark.task.cpus", "1") or "1"), 1)
    local = _LOCAL.fullmatch(master)
    if local is not None:
        cores = local.group(1)
        if cores == "*":
            return None
        return (int(cores) if cores else 1) // task_cpus
    cluster = _LOCAL_CLUSTER.fullmatch(master)
    if cluster is not None:
        return int(cluster.group(1)) * int(cluster.group(2)) // task_cpus
    instances = conf.get("spark.executor.instances", None)
    cores = conf.get("spark.executor.cores", None)
    if instances and cores:
        return int(instances) * int(cores) // task_cpus
    return None


def _probed_parallelism(spark: SparkSession) -> int:
    """The default parallelism as the server has it: ``spark.range`` without a partition count
    gets that many partitions (a SQL-only job over 64 Ki longs; no Python worker)."""
    from pyspark.sql import functions as F

    ids = spark.range(0, 1 << 16).select(F.spark_partition_id().alias("p"))
    row = ids.agg(F.max("p").alias("p")).first()
    return int(row["p"]) + 1 if row is not None and row["p"] is not None else 1


def _master(spark: SparkSession) -> str:
    if is_connect(spark):
        return spark.conf.get("spark.master", "") or ""
    return spark.sparkContext.master or ""


def check_slots(spark: SparkSession, tasks: int) -> None:
    """Raises at once when a barrier stage of ``tasks`` tasks cannot run, instead of letting
    Spark's own check wait for about ten minutes before it fails."""
    slots = concurrent_slots(spark)
    master = _master(spark)
    # A count read from a Connect session's configuration does not grow by waiting.
    settled = master.startswith("local[") or (is_connect(spark) and _configured_slots(spark) is not None)
    if slots < tasks and not settled:
        # Executors may still be registering.
        deadline = time.monotonic() + REGISTRATION_WAIT
        while slots < tasks and time.monotonic() < deadline:
            time.sleep(0.25)
            slots = concurrent_slots(spark)
    if slots < tasks:
        raise ValueError(
            f"creditflow exchange needs {tasks} task slots at once (one per partition, all running "
            f"together in a barrier stage) but the cluster has {slots} (master {master!r}). Use fewer "
            f"partitions (num_partitions={slots} or df.repartition({slots}) first), or give Spark more "
            "cores (local[N], more executors or spark.executor.cores)."
        )


#: The local property Spark sets to a streaming query's id in the jobs of its micro-batches.
QUERY_ID_PROPERTY = "sql.streaming.queryId"


def query_of(df: DataFrame) -> str | None:
    """The id of the streaming query whose micro-batch ``df`` is, inside ``foreachBatch`` on a
    classic session (the function runs on the query's thread, which carries the id); None
    elsewhere (a Connect session's ``foreachBatch`` runs in a process of its own)."""
    spark = df.sparkSession
    if is_connect(spark):
        return None
    value = spark.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
    return str(value) if value else None
