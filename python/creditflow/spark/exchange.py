"""``exchange``: a pipelined, backpressured repartition-by-key inside one barrier stage.

Every task of a barrier ``mapInArrow`` stage attaches to its host's creditflow service (or,
with ``host_service=False``, gets its Python worker's own environment), creates a partition
with one subpartition per task, tells the others where it is (through the
driver's rendezvous on a classic session, ``BarrierTaskContext.allGather`` on a Connect one:
see :mod:`creditflow.spark._rendezvous`), and then does two things at once:

* a writer thread pushes the task's input through ``RecordWriter(HashPartitioner(keys))``:
  row r goes to task ``pmod(hash(keys), n)``, Spark's own rule, so rows land where
  ``df.repartition(n, *keys)`` puts them;
* the task's own thread yields what its ``InputGate`` receives from every task (itself
  included, handed over without serialization), or what ``func`` makes of it.

Writing beside reading keeps the all-to-all from deadlocking; credit-based flow control keeps
every task's memory within its ``memory`` setting whatever the data size, and a slow task
slows its producers instead of filling them up. With the host service, a task whose gate has
ended is done: its partition lives in the service until every task has read it. With its own
environment, a task waits until its partition has been read by everyone before it lets go of it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import pyarrow as pa
from pyspark import BarrierTaskContext
from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

import creditflow as cf
from creditflow.samples import TaskSample
from creditflow.spark._driver import (
    HOST_MEMORY_CONF,
    application_id,
    check_slots,
    host_memory,
    is_connect,
    prepare,
    slots_per_host,
    use_host_service,
)
from creditflow.spark._merge import merged_for_split
from creditflow.spark._process import (
    EnvSettings,
    TlsFiles,
    check_bytes,
    check_task_settings,
    metrics_url_of,
    task_stack,
)
from creditflow.spark._rendezvous import driver_rendezvous, gather
from creditflow.spark.monitor import Monitor, MonitorHandle, Reporter

#: What ``func`` receives and returns: the batches of one output partition.
PartitionFunction = Callable[[Iterator[pa.RecordBatch]], Iterable[pa.RecordBatch]]

#: The partition kinds an exchange can use (``kind=``).
ExchangeKind = Literal["pipelined", "hybrid"]

#: How an exchange's tasks learn where the others are (``rendezvous=``).
Rendezvous = Literal["driver", "barrier"]

#: Segments a hybrid partition's pool needs beyond a pipelined one's (its readers' disk reads;
#: docs/design.md "Memory").
HYBRID_EXTRA_SEGMENTS = 8


@dataclass(frozen=True)
class _Plan:
    """Everything a task needs, shipped in the closure (so the secret never sits in a conf)."""

    exchange_id: str
    keys: tuple[str, ...]
    num_tasks: int
    kind: ExchangeKind
    env: EnvSettings
    timeout: float | None
    func: PartitionFunction | None
    monitor: MonitorHandle | None
    #: The driver's rendezvous (address, key); None: Spark's ``allGather``.
    rendezvous: tuple[str, str] | None = None
    #: The application whose host services the tasks attach to; None: an environment per task.
    app_id: str | None = None
    #: The application's host memory (bytes; with ``app_id``).
    host_memory: int = 0


def exchange(
    df: DataFrame,
    keys: str | Sequence[str],
    *,
    num_partitions: int | None = None,
    func: PartitionFunction | None = None,
    schema: StructType | str | None = None,
    memory: int | str = "64MiB",
    segment_size: int | str = "32KiB",
    buffer_timeout: float = 0.1,
    exclusive_buffers: int = 2,
    floating_buffers: int = 8,
    kind: ExchangeKind = "pipelined",
    spill_dir: str | None = None,
    wire_compression: str | None = None,
    shared_memory: bool = True,
    tls: cf.TLSConfig | None = None,
    peer_timeout: float = 30.0,
    timeout: float | None = 600.0,
    monitor: Monitor | None = None,
    rendezvous: Rendezvous | None = None,
    host_service: bool | None = None,
) -> DataFrame:
    """Repartitions ``df`` by ``keys`` through creditflow, pipelined, in one barrier stage.

    Returns a DataFrame with ``df``'s schema (or ``schema`` when ``func`` changes it) whose
    partition i holds exactly the rows ``df.repartition(n, *keys)`` puts in partition i.
    Nothing runs until an action; each action runs the exchange again.

    The exchange pays when Python work follows it in its own stage: pass that work as
    ``func``, or call ``mapInArrow(f, schema)`` directly on the returned DataFrame, which runs
    ``f`` in the same tasks (after ``func``, if given). After any other step (``select``,
    ``filter``, ...) a ``mapInArrow`` is a second Python pass that Spark does not fuse: every
    row goes back to the JVM and out to Python again, which costs more than the exchange saves
    (more than ``df.repartition(n, *keys).mapInArrow(f)``). When Spark SQL follows (``groupBy``,
    joins), Spark's own ``repartition`` feeds it without Python. Figures: the README's PySpark
    section and docs/benchmarks.md.

    Args:
        df: The input. Its partitions become the exchange's tasks.
        keys: Column name(s) to hash, as for ``df.repartition(n, *keys)``.
        num_partitions: Number of tasks and output partitions; default ``df``'s number of
            partitions. A different number repartitions ``df`` round-robin first (a Spark
            shuffle), because a barrier stage cannot change its number of partitions.
        func: Runs on each output partition's batches (an iterator of
            ``pyarrow.RecordBatch``) and yields the batches to return, so a per-key
            aggregation needs no second stage. Its output must match ``schema``.
        schema: The output schema when ``func`` changes it (default: ``df.schema``).
        memory: creditflow network memory per task with ``host_service=False`` (bounds what a
            task holds in flight). The tasks attached to a host service share its memory,
            the session's ``spark.creditflow.hostMemory`` (default 64 MiB per task slot of a
            host), instead; there ``memory`` bounds what a task's writer holds in place in
            the task (its link's heap: at least 1 MiB).
        segment_size, buffer_timeout, exclusive_buffers, floating_buffers: as for
            :class:`creditflow.NetworkEnvironment`.
        kind: Each task's partition: ``"pipelined"`` (default: a slow task's producers wait
            for it, everything stays in memory) or ``"hybrid"`` (a producer never waits for
            a slow task: what that task has not read yet spills to ``spill_dir``; the
            producer's writer finishes early, its task still waits until everything it wrote
            has been read). See docs/design.md "Spillable partitions".
        spill_dir: Where ``kind="hybrid"`` spills (default: ``creditflow-spill`` in the
            system temp dir), as for :class:`creditflow.NetworkEnvironment`.
        wire_compression, shared_memory: as for :class:`creditflow.NetworkEnvironment`:
            ``"lz4"`` or ``"zstd"`` compresses what each task sends (pays between hosts on
            a slow network); ``shared_memory=False`` keeps tasks of one host on loopback TCP
            with environments per task (``host_service=False``); a host service's tasks
            attach to it over shared memory, and their channels are local to it, either way.
        tls: A :class:`creditflow.TLSConfig`: every connection between the tasks is TLS with
            these files, which each executor reads at these paths. The certificate must be
            valid for the address of every executor that presents it (a certificate per host
            at the same path, or one naming every executor's address), and mutual TLS
            (``client_auth=True``, the default) makes every task prove itself too. The
            exchange's own fresh secret still authenticates every connection and the
            tasks' meeting through the driver (which carries addresses, not data).
        peer_timeout: Seconds another host may acknowledge nothing (a cut link, a vanished
            executor) before the connections to it fail with ``ConnectionLostError`` and
            the task with them (Spark then retries the stage), as for
            :class:`creditflow.NetworkEnvironment`; ``0`` leaves the OS's defaults (minutes).
        timeout: Longest a task waits without progress (for a buffer, for data, or for its
            consumers to finish reading), in seconds; None waits without limit.
        monitor: A :class:`creditflow.spark.Monitor` that receives live per-task metrics.
        rendezvous: How the tasks learn where the others are. ``"driver"`` (the default on a
            classic session): through a small server in this process, which the executors
            reach as they reach the driver. ``"barrier"`` (the default, and the only choice,
            on a Spark Connect session, whose client the executors may not reach): Spark's
            ``BarrierTaskContext.allGather``, which answers up to a second late. Choose
            ``"barrier"`` when a firewall lets executors reach only the driver's Spark ports.
        host_service: ``True``: the tasks of each host attach to one creditflow service per
            host and application (started on demand; docs/design.md "The host service"): one
            pool for the host (``spark.creditflow.hostMemory``), one connection per pair of
            hosts, and a task's partition outlives it. ``False``: each task gets an
            environment of its own (a pool per task, a connection per pair of tasks). ``None``
            (the default): the session's ``spark.creditflow.hostService`` (default true).

    Raises:
        ValueError: for fewer task slots than partitions (at once, naming both numbers and
            the fix), bad keys, an unknown ``kind`` or ``rendezvous``, or a bad setting.
    """
    if kind not in get_args(ExchangeKind):
        raise ValueError(f"kind must be one of {list(get_args(ExchangeKind))}, got {kind!r}")
    check_task_settings(
        memory=memory,
        segment_size=segment_size,
        wire_compression=wire_compression,
        peer_timeout=peer_timeout,
        timeout=timeout,
    )
    if rendezvous is not None and rendezvous not in get_args(Rendezvous):
        raise ValueError(f"rendezvous must be one of {list(get_args(Rendezvous))}, got {rendezvous!r}")
    key_list = (keys,) if isinstance(keys, str) else tuple(keys)
    if not key_list:
        raise ValueError("exchange needs at least one key column")
    missing = [k for k in key_list if k not in df.columns]
    if missing:
        raise ValueError(f"key column(s) {missing} not in the DataFrame (columns: {df.columns})")
    if func is not None and not callable(func):
        raise TypeError(f"func must be callable, got {type(func).__name__}")
    _check_key_types(df, key_list)
    spark = df.sparkSession
    n = prepare(df)
    if num_partitions is not None:
        if num_partitions < 1:
            raise ValueError(f"num_partitions must be at least 1, got {num_partitions}")
        if num_partitions != n:
            df = df.repartition(num_partitions)
            n = num_partitions
    check_slots(spark, n)
    app_id = application_id(spark) if use_host_service(spark, host_service) else None
    settings = EnvSettings(
        # A host service serves every exchange of its application: they share its secret.
        secret=_app_secret(app_id) if app_id is not None else secrets.token_hex(32),
        memory=memory,
        segment_size=segment_size,
        buffer_timeout=buffer_timeout,
        exclusive_buffers=exclusive_buffers,
        floating_buffers=floating_buffers,
        spill_dir=spill_dir,
        wire_compression=wire_compression,
        shared_memory=shared_memory,
        tls=TlsFiles.of(tls),
        peer_timeout=float(peer_timeout),
        # Every peer reads this task's partition over a connection of its own: past 512 tasks
        # the default limit would refuse some of them.
        max_connections=max(EnvSettings.max_connections, 2 * n),
    )
    memory = host_memory(spark) if app_id is not None else 0
    # Fail on the driver for settings the tasks would refuse (memory too small for n tasks...).
    if app_id is None:
        _check_settings(settings, n, kind)
    else:
        _check_settings(settings, n, kind, host_tasks=min(n, slots_per_host(spark)), host_memory=memory)
    plan = _Plan(
        rendezvous=_rendezvous_of(spark, rendezvous),
        exchange_id=uuid.uuid4().hex[:12],
        keys=key_list,
        num_tasks=n,
        kind=kind,
        env=settings,
        timeout=timeout,
        func=func,
        monitor=monitor.handle if monitor is not None else None,
        app_id=app_id,
        host_memory=memory,
    )
    out_schema = df.schema if schema is None else schema

    return _fusing(df, plan, out_schema)


#: The secret of each application's host services (one per application, on its driver).
_APP_SECRETS: dict[str, str] = {}
_APP_SECRETS_LOCK = threading.Lock()


def _app_secret(app_id: str) -> str:
    """The secret every exchange of application ``app_id`` gives its host services."""
    with _APP_SECRETS_LOCK:
        return _APP_SECRETS.setdefault(app_id, secrets.token_hex(32))


def _rendezvous_of(spark: Any, choice: Rendezvous | None) -> tuple[str, str] | None:
    """The driver rendezvous's (address, key) the tasks use, or None for ``allGather``."""
    connect = is_connect(spark)
    if choice == "driver" and connect:
        raise ValueError(
            "rendezvous='driver' needs a classic session: the executors of a Spark Connect "
            "session may not reach its client (use rendezvous='barrier', the default there)"
        )
    if choice == "barrier" or (choice is None and connect):
        return None
    host = spark.conf.get("spark.driver.host", None) or "127.0.0.1"
    tracker = spark.sparkContext.statusTracker()

    def stage_attempt(stage: int) -> int:
        info = tracker.getStageInfo(stage)
        return int(info.currentAttemptId) if info is not None else 0

    r = driver_rendezvous(host, stage_attempt)
    return (r.address, r.key)


def _fusing(df: DataFrame, plan: _Plan, schema: StructType | str, profile: Any = None) -> DataFrame:
    """The exchange's barrier stage over ``df``, as a DataFrame whose own ``mapInArrow`` runs
    its function inside that stage (see :class:`_FusesMapInArrow`)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return _task(plan, batches)

    out = df.mapInArrow(run, schema, barrier=True, profile=profile)
    base = type(out)
    fusing = _FUSING_CLASSES.get(base)
    if fusing is None:
        fusing = _FUSING_CLASSES.setdefault(base, type(base.__name__, (_FusesMapInArrow, base), {}))
    # Same instance layout (the mixin adds only a method): the result stays a plain DataFrame
    # of its session's kind (classic or Connect) for every other method.
    out.__class__ = fusing
    out.__dict__["_creditflow_fuse"] = (df, plan)
    return out


class _FusesMapInArrow:
    """Mixed into the DataFrame ``exchange`` returns: ``exchange(df, keys).mapInArrow(f, schema)``
    runs ``f`` in the exchange's own tasks, as ``exchange(df, keys, func=f, schema=schema)``
    does, instead of sending every row back to the JVM and out to Python again."""

    def mapInArrow(
        self, func: PartitionFunction, schema: StructType | str, barrier: bool = False, profile: Any = None
    ) -> DataFrame:
        """``func`` runs on the exchange's output partitions inside its barrier stage (one
        Python pass instead of two). ``barrier`` is accepted and has no effect: the stage is
        a barrier stage already."""
        df, plan = self.__dict__["_creditflow_fuse"]
        fused = dataclasses.replace(plan, func=_then(plan.func, func))
        return _fusing(df, fused, schema, profile)


#: The fusing subclass of each DataFrame class (classic, Connect), made once.
_FUSING_CLASSES: dict[type, type] = {}


def _then(first: PartitionFunction | None, second: PartitionFunction) -> PartitionFunction:
    """``second`` applied to what ``first`` yields (``second`` alone without ``first``)."""
    if first is None:
        return second

    def both(batches: Iterator[pa.RecordBatch]) -> Iterable[pa.RecordBatch]:
        return second(iter(first(batches)))

    return both


def _check_key_types(df: DataFrame, keys: tuple[str, ...]) -> None:
    """Checks the key columns' Arrow types against the hash partitioner on the driver, so that
    a key type Spark's hash does not take (arrays, maps...) fails here, not in every task."""
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType as _StructType

    schema = to_arrow_schema(_StructType([df.schema[k] for k in keys]))
    try:
        cf.HashPartitioner(list(keys)).check_schema(schema)
    except cf.InvalidArgumentError as exc:
        raise ValueError(f"cannot exchange by {list(keys)}: {exc}") from None


def _check_settings(
    settings: EnvSettings,
    n: int,
    kind: ExchangeKind = "pipelined",
    *,
    host_tasks: int = 0,
    host_memory: int = 0,
) -> None:
    """Fails on the driver, with creditflow's numbers, when the memory cannot hold what the
    tasks need, rather than in every task. Each task needs its partition (n subpartitions + 1
    segments, a hybrid one 8 more) and its gate (exclusive buffers for each channel from
    another stack + at least one floating). With an environment per task (``host_tasks`` 0)
    that is n - 1 remote channels in ``settings.memory``; with host services, up to
    ``host_tasks`` tasks on one host, whose channels from each other are local, in
    ``host_memory``."""
    segment = cf.parse_bytes(settings.segment_size)
    partition = n + 1 + (HYBRID_EXTRA_SEGMENTS if kind == "hybrid" else 0)

    def per_task(on_host: int) -> int:
        return partition + (n - on_host) * settings.exclusive_buffers + 1

    if host_tasks <= 0:
        total = cf.parse_bytes(settings.memory) // max(segment, 1)
        required = per_task(1)
        if required <= total:
            return
        raise cf.InsufficientBuffersError(
            f"an exchange over {n} tasks needs at least {required} segments per task ({partition} for its "
            f"partition, {n - 1} x exclusive_buffers={settings.exclusive_buffers} + 1 for its gate) but "
            f"memory={settings.memory!r} holds {total} segments of {segment} bytes: raise memory= or "
            "lower segment_size=",
            required=required,
            available=total,
            total=total,
            segment_size=segment,
        )
    total = host_memory // max(segment, 1)
    on_host = max(range(1, host_tasks + 1), key=lambda k: k * per_task(k))
    required = on_host * per_task(on_host)
    if required > total:
        raise cf.InsufficientBuffersError(
            f"an exchange over {n} tasks needs at least {required} segments in a host service with "
            f"{on_host} of its tasks ({partition} for each partition, {n - on_host} x "
            f"exclusive_buffers={settings.exclusive_buffers} + 1 for each gate) but the host's memory "
            f"({HOST_MEMORY_CONF}={host_memory} bytes) holds {total} segments of {segment} bytes: raise "
            f"{HOST_MEMORY_CONF} or lower segment_size=",
            required=required,
            available=total,
            total=total,
            segment_size=segment,
        )


class _Writer:
    """The task's writer thread: its input through the hash partitioner into its partition."""

    def __init__(self, part: cf.ResultPartition, plan: _Plan, batches: Iterator[pa.RecordBatch]) -> None:
        self.error: BaseException | None = None
        self.write_seconds = 0.0
        self._part = part
        self._plan = plan
        self._batches = batches
        self._thread = threading.Thread(target=self._run, name="creditflow-exchange-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            with cf.RecordWriter(self._part, cf.HashPartitioner(list(self._plan.keys))) as w:
                # The hot loop: rows and bytes are counted by the partition (its metrics), not
                # here (``batch.nbytes`` walks every buffer of the batch).
                write, timeout, clock = w.write, self._plan.timeout, time.perf_counter
                # Small input batches would split into pieces of a few rows each (_merge).
                memory = check_bytes("memory", self._plan.env.memory)
                for batch in merged_for_split(self._batches, self._plan.num_tasks, memory):
                    start = clock()
                    write(batch, timeout=timeout)
                    self.write_seconds += clock() - start
        except BaseException as exc:  # reported by the task's own thread
            self.error = exc

    def join(self) -> None:
        self._thread.join()


def _task(plan: _Plan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    ctx = BarrierTaskContext.get()
    infos = ctx.getTaskInfos()
    tasks = len(infos)
    _check_whole_stage(plan, tasks)
    me = ctx.partitionId()
    host = infos[me].address.rpartition(":")[0]
    with task_stack(plan.env, host, plan.app_id, plan.host_memory) as stack:
        served = metrics_url_of(stack) if plan.monitor is not None and plan.monitor.metrics else None
        own_env = isinstance(stack, cf.NetworkEnvironment)
        yield from _exchange_in(plan, ctx, me, tasks, stack, served, batches, own_env=own_env)


def _exchange_in(
    plan: _Plan,
    ctx: BarrierTaskContext,
    me: int,
    tasks: int,
    env: cf.NetworkEnvironment | cf.Attachment,
    served: str | None,
    batches: Iterator[pa.RecordBatch],
    own_env: bool,
) -> Iterator[pa.RecordBatch]:
    """One task of the exchange in ``env``: this process's environment (``own_env``: the task
    must wait until its partition is read before it lets go of it) or the host service."""
    part = env.create_partition(
        f"cf-exchange/{plan.exchange_id}/{ctx.taskAttemptId()}", tasks, kind=plan.kind
    )
    gate: cf.InputGate | None = None
    writer: _Writer | None = None
    done = False

    def sample() -> TaskSample:
        out = _sample(plan, me, part, gate, writer)
        out.metrics_url = served
        return out

    reporter = Reporter(plan.monitor, sample)
    try:
        peers = _meet(plan, ctx, {"address": env.address, "partition": part.id}, tasks)
        gate = env.create_input_gate([cf.ChannelSpec(p["address"], p["partition"], me) for p in peers])
        writer = _Writer(part, plan, batches)
        inputs = _receive(gate, plan.timeout)
        outputs = plan.func(inputs) if plan.func is not None else inputs
        try:
            yield from outputs
        except Exception as exc:
            # A failure of our own writer also reaches our gate (from our own subpartition,
            # as ProducerFailedError): report the cause, not the echo. Our readers get the
            # cause as well: a peer still reading would otherwise fail with the release's
            # message, and Spark names only the first failure of a barrier stage it handles.
            _fail_with(part, me, exc)
            part.release()
            writer.join()
            if own_env:
                # Spark ends a failed task's Python worker at once, skipping atexit, which
                # would drop the failure still on its way to peers' readers (it waits behind
                # the data queued for a peer that does not read yet): closing the environment
                # hands it over first, within its drain timeout.
                # The next task of this process gets a new environment.
                env.close()
            if writer.error is not None and not isinstance(writer.error, cf.ClosedError):
                raise writer.error from exc
            raise
        writer.join()
        if writer.error is not None:
            raise writer.error
        if own_env:
            # Everyone has read our partition only when it is released: until then its
            # process (and this environment) must stay.
            part.wait_consumed(timeout=plan.timeout)
        # In a host service the finished partition stays until everyone has read it.
        done = True
    finally:
        reporter.stop()
        if not done:
            # On failure: stops a writer still blocked on a buffer (it raises ClosedError).
            part.release()
        if writer is not None:
            writer.join()
        if gate is not None:
            gate.close()


def _fail_with(part: cf.ResultPartition, me: int, exc: BaseException) -> None:
    """Ends ``part`` with ``exc`` as its failure, which its readers raise (as
    ``ProducerFailedError``); nothing when it has ended already. The writer thread's next write
    then raises ``ClosedError``."""
    with contextlib.suppress(cf.CreditflowError):
        cf.RecordWriter(part).fail(f"exchange task {me} failed: {type(exc).__name__}: {exc}")


def _check_whole_stage(plan: _Plan, tasks: int) -> None:
    """Refuses to run in a stage attempt with fewer tasks than the exchange has: Spark can
    retry a barrier stage for only the partitions it has no output for (when a task of the
    failed attempt finished just before the failure was handled), and split over fewer tasks
    the rows would go to the wrong ones, silently. Failing makes Spark run the stage again."""
    if tasks != plan.num_tasks:
        raise RuntimeError(
            f"creditflow exchange {plan.exchange_id}: this stage attempt runs {tasks} of the "
            f"exchange's {plan.num_tasks} tasks (Spark retried only some tasks of the barrier "
            "stage); an exchange needs all of them at once, so this attempt fails rather than "
            "put rows in the wrong partitions"
        )


def _meet(plan: _Plan, ctx: BarrierTaskContext, me: dict[str, Any], tasks: int) -> list[dict[str, Any]]:
    """Every task's ``me``, by task index (this one's included)."""
    if plan.rendezvous is None:
        return [json.loads(m) for m in ctx.allGather(json.dumps(me))]
    address, key = plan.rendezvous
    try:
        return gather(
            address,
            key,
            group=plan.exchange_id,
            stage=ctx.stageId(),
            tasks=tasks,
            task=ctx.partitionId(),
            attempt=ctx.taskAttemptId(),
            entry=me,
            timeout=plan.timeout,
        )
    except OSError as exc:
        raise RuntimeError(
            f"this exchange task cannot reach the driver's rendezvous at {address} ({exc}); if a "
            "firewall lets executors reach only the driver's Spark ports, pass rendezvous='barrier'"
        ) from exc


def _receive(gate: cf.InputGate, timeout: float | None) -> Iterator[pa.RecordBatch]:
    """The gate's batches until every task's partition has ended (the gate counts them)."""
    take = gate.next
    while (batch := take(timeout=timeout)) is not None:
        yield batch


def _sample(
    plan: _Plan,
    task: int,
    part: cf.ResultPartition,
    gate: cf.InputGate | None,
    writer: _Writer | None,
) -> TaskSample:
    pm = part.metrics()
    gm = gate.metrics() if gate is not None else None
    sample = TaskSample.of_partition(
        part,
        job=plan.exchange_id,
        kind="exchange",
        partition_kind=plan.kind,
        task=task,
        partition_id=part.id,
        # What the task wrote (its input, split) and what its gate received.
        rows_written=pm["rows_written"],
        bytes_written=pm["bytes_written"],
        write_seconds=writer.write_seconds if writer else 0.0,
    )
    if gm is not None:
        sample.rows_received = gm["rows_received"]
        sample.bytes_received = gm["bytes_received"]
        sample.in_pool_usage = gm["pool"]["usage"]
        sample.idle_ms_per_second = gm["idle_ms_per_second"]
        sample.idle_total = gm["idle_total"]
        # Channel i reads task i's partition (the gate lists the peers in task order).
        channels = sorted(gm["channels"], key=lambda c: c["index"])
        sample.channel_bytes = [c["bytes_received"] for c in channels]
    return sample
