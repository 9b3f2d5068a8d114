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
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import DataFrame, SparkSession

import creditflow as cf

if TYPE_CHECKING:  # pyspark-client (Connect only) has no SparkContext to import
    from pyspark import SparkContext

#: How long to wait for executors to register before saying there are too few slots
#: (a local-cluster or a real cluster registers its executors after the session starts).
REGISTRATION_WAIT = 30.0

#: The Spark setting (``spark.conf.set(HOST_SERVICE_CONF, "false")``) that chooses the network
#: stack of ``exchange`` and ``send`` when the call does not: ``true`` (the default) attaches the
#: tasks of each host to its creditflow host service, ``false`` gives each Python worker an
#: environment of its own (a pool per task, a connection per pair of tasks).
HOST_SERVICE_CONF = "spark.creditflow.hostService"

#: The Spark setting that sizes each host service's network memory (bytes, or a size such as
#: ``"2GiB"``): one pool per host, from which the partitions and gates of the tasks attached to
#: it take their local pools as they come and go. Read once per application, before its first
#: job through the services; a later different value is refused (the services keep theirs).
HOST_MEMORY_CONF = "spark.creditflow.hostMemory"

#: :data:`HOST_MEMORY_CONF`'s default: this much for each task slot of a host (an environment's
#: own default ``memory``), so that a host's tasks have together what each had alone.
HOST_MEMORY_PER_SLOT = "64MiB"

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


def use_host_service(spark: Any, choice: bool | None) -> bool:
    """Whether a job's tasks use their hosts' service: ``choice`` when given, else the session's
    :data:`HOST_SERVICE_CONF` (default true). Raises :class:`ValueError` for a value that is
    neither true nor false."""
    if choice is not None:
        return choice
    value = str(spark.conf.get(HOST_SERVICE_CONF, "true") or "true").strip().lower()
    if value not in ("true", "false"):
        raise ValueError(f"{HOST_SERVICE_CONF} must be true or false, got {value!r}")
    return value == "true"


#: The host memory of each application, as first read (:func:`host_memory`).
_HOST_MEMORY: dict[str, int] = {}
_HOST_MEMORY_LOCK = threading.Lock()


def host_memory(spark: Any) -> int:
    """The network memory of each host service of ``spark``'s application, in bytes: the
    session's :data:`HOST_MEMORY_CONF`, else :data:`HOST_MEMORY_PER_SLOT` times the task slots
    of a host (:func:`slots_per_host`). The first answer holds for the application: raises
    :class:`ValueError` for a value that is not a size, and for a value that differs from the
    one the application's services already run with."""
    app = application_id(spark)
    value = spark.conf.get(HOST_MEMORY_CONF, None)
    if value is None or not str(value).strip():
        memory = cf.parse_bytes(HOST_MEMORY_PER_SLOT) * slots_per_host(spark)
    else:
        try:
            memory = cf.parse_bytes(str(value).strip())
        except ValueError as exc:
            raise ValueError(
                f"{HOST_MEMORY_CONF} must be a size such as 512MiB, got {value!r}: {exc}"
            ) from None
    with _HOST_MEMORY_LOCK:
        first = _HOST_MEMORY.setdefault(app, memory)
    if first != memory:
        raise ValueError(
            f"{HOST_MEMORY_CONF} is read once per application: its host services run with {first} bytes, "
            f"and it now says {value!r} ({memory} bytes). Set it before the application's first exchange or "
            "send (in the session's configuration), or pass host_service=False for environments per task."
        )
    return memory


def application_id(spark: Any) -> str:
    """The Spark application's id (classic and Connect sessions): host services are per
    application."""
    if not is_connect(spark):
        return str(spark.sparkContext.applicationId)
    return str(spark.conf.get("spark.app.id", None) or "connect-" + str(spark.session_id))


def slots_per_host(spark: Any) -> int:
    """How many tasks one executor (host) runs at once, which a host service's ``memory`` is
    sized for: ``spark.executor.cores``, ``local[N]``'s N or ``local-cluster``'s cores per
    worker (each divided by ``spark.task.cpus``); the whole cluster's slots when the
    configuration does not say."""
    conf = spark.conf
    master = (conf.get("spark.master", "") or "").strip()
    task_cpus = max(int(conf.get("spark.task.cpus", "1") or "1"), 1)
    cores = conf.get("spark.executor.cores", None)
    cluster = _LOCAL_CLUSTER.fullmatch(master)
    if cluster is not None:
        cores = cluster.group(2)
    elif _LOCAL.fullmatch(master) is not None:
        cores = None  # one host: every slot is on it
    if cores:
        return max(int(cores) // task_cpus, 1)
    return max(concurrent_slots(spark), 1)


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
