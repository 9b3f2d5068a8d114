"""Streaming a DataFrame out of Spark into other processes, with backpressure.

The consumer (a trainer, a service: any Python process outside Spark) opens a
:class:`Receiver` and hands its ``address`` and ``secret`` to the driver, which calls
:func:`send`. Every task then creates a partition in its worker's environment, registers it
with the receiver (an authenticated control message) and writes its batches into it as Spark
computes them; the receiver reads every registered partition through credit-based channels.
A consumer that reads slowly holds back its credit, so the tasks' writers block, and with them
the Spark computation feeding them: executor memory stays within each task's ``memory``.

A :class:`Receiver` works in one of four modes, each a class of its own behind this face:

* batches in arrival order through a bounded queue (:class:`creditflow.spark._modes.Direct`);
* ``spill=True``: kept in a hybrid partition that spills, so the job finishes at Spark's
  speed, and replayed for epochs (:class:`creditflow.spark._modes.Spooled`);
* ``rank=r, world_size=W, batch_size=B``: one rank of a training job
  (:class:`creditflow.spark._rank.Ranked`): batches of B rows, the same number on every rank
  in every epoch, epochs replayed from memory or spill, shuffled, resumable;
* ``continuous=True``: one job after another (a streaming query's micro-batches), each
  withheld until it commits and delivered once, with a boundary after each
  (:class:`creditflow.spark._continuous.Continuous`).
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa
from pyspark.sql import DataFrame

import creditflow as cf
from creditflow._closeable import Closeable
from creditflow.metrics import ContinuousMetrics, RankMetrics, ReceiverMetrics, SpillMetrics
from creditflow.spark._batchlog import BatchLog
from creditflow.spark._continuous import Continuous
from creditflow.spark._driver import application_id, host_memory, prepare, query_of, use_host_service
from creditflow.spark._modes import Direct, Spooled
from creditflow.spark._process import EnvSettings, TlsFiles, check_task_settings, check_timeout
from creditflow.spark._rank import Options, Ranked
from creditflow.spark._rankstate import RankState
from creditflow.spark._sending import (
    STATS_SCHEMA,
    SendPlan,
    addresses_of,
    end_job,
    is_replay,
    register_job,
    send_from_driver,
    send_task,
    tell_job_failed,
)
from creditflow.spark._staging import Item
from creditflow.spark.monitor import Monitor

if TYPE_CHECKING:
    from creditflow.prometheus import MetricsServer

#: Shuffle window of a rank, in batches (``shuffle_window`` defaults to this times batch_size).
WINDOW_BATCHES = 8


class Receiver(Closeable):
    """Receives DataFrames that :func:`send` streams out of Spark.

    Args:
        memory, segment_size: this process's creditflow network memory (see
            :class:`creditflow.NetworkEnvironment`).
        bind: The host (name or IP address) the receiver listens on; the executors (or the
            driver, with ``via="driver"``) must reach it. Its ports are ephemeral.
        secret: Shared by the receiver and the tasks (default: a fresh random one; give the
            driver :attr:`secret`). The ranks of one job share one secret.
        max_queued: Batches received but not yet taken by the consumer; beyond that, the
            channels stop returning credit and the Spark tasks block. Not used with
            ``spill=True``.
        timeout: Longest :meth:`next`/iteration waits for a batch, in seconds (None: no limit).
        spill: Let Spark finish first: read the tasks as fast as Spark sends and keep what
            the consumer has not taken yet in a hybrid partition of this receiver's
            environment, which holds at most ``memory`` and spills the rest to
            ``spill_dir``; the job completes and frees its executors while the consumer
            reads at its own pace. Default False: the tasks wait for the consumer
            (backpressure).
        replay: With ``spill=True``, keep the whole stream until :meth:`close` so that it can
            be read again: every ``iter(rx)`` starts from the first batch, without Spark
            computing anything again. Default: True when ``epochs > 1``. Without replay,
            what the consumer read is freed at once, and at ``max_spill`` the tasks wait
            for the consumer.
        epochs: With ``spill=True`` and replay, how many times one iteration goes through
            the whole stream (default 1).
        spill_dir: With ``spill=True`` or a rank, where the spill file goes (see
            :class:`creditflow.NetworkEnvironment`; default ``creditflow-spill`` in the
            system temp dir).
        max_spill: With ``spill=True`` or a rank, the most bytes the spill file may hold
            (default unbounded). Without replay, the tasks then wait for the consumer; with
            replay (and a rank), the receiver cannot keep the stream: it fails with
            :class:`creditflow.SpillError` naming ``max_spill``, the consumer gets
            :class:`creditflow.ProducerFailedError` and :func:`send` raises with that
            message.
        rank, world_size: This receiver is rank ``rank`` of ``world_size`` ranks of a training
            job: :func:`send` is given every rank's address, in rank order, and every row of
            the DataFrame reaches exactly one rank per epoch. With ``job=`` they default to
            the ``RANK`` and ``WORLD_SIZE`` environment variables (``torchrun`` sets them).
        batch_size: A rank yields batches of exactly this many rows, and every rank the same
            number of batches in every epoch (see ``drop_last``).
        shuffle: A rank's order: True (default) shuffles the order of its blocks and, within
            a window of ``shuffle_window`` rows, of its rows, every epoch, seeded by
            ``(seed, epoch)``; ``"global"`` also deals the blocks out to the ranks anew
            in every epoch after the first (they move between the rank processes); False
            keeps arrival order (epoch 0) and the runs' order.
        seed: The shuffle's seed (the same on every rank).
        drop_last: False (default): every row once per epoch; each rank's last batch of an
            epoch holds its share of the remainder (1 to ``batch_size`` rows). True: every
            batch has ``batch_size`` rows; fewer than ``world_size × batch_size`` rows per
            epoch are left out (others each epoch when shuffled).
        shuffle_window: Rows a rank mixes at once (default 8 batches).
        state: A rank's :meth:`state_dict` from before a restart: the rank continues at the
            next batch of that epoch, without a row twice or missing, given the same
            DataFrame (see docs/guide.md, "Resume").
        job: A training job's spec (:class:`creditflow.spark.TrainingJob`; default the
            ``CREDITFLOW_JOB`` environment variable when a rank is asked for and no secret is
            given): the rank takes the job's secret and tells the driver its address.
        tls: A :class:`creditflow.TLSConfig`: the receiver reads the tasks' partitions over
            TLS (pass :func:`send` the same kind of files: each task's certificate must be
            valid for its executor's address, the receiver's for ``bind``). The secret still
            authenticates both ends and the registrations sent to :attr:`address` (which
            carry where the partitions are, not data).
        peer_timeout: Seconds a task's host may acknowledge nothing (a cut link, a vanished
            executor) before the receiver's connections to it fail (see
            :class:`creditflow.NetworkEnvironment`; ``0``: the OS's defaults).

    Iterate it (or call :meth:`next`) to get ``pyarrow.RecordBatch`` objects: without a rank,
    in the order they arrive (partitions interleave), ending once the job that registered
    with it delivered every partition; a rank's, the current epoch's batches
    (:meth:`set_epoch`). Raises :class:`ValueError` for ``replay``, ``epochs``, ``spill_dir``
    or ``max_spill`` without ``spill=True`` or a rank, for ``epochs > 1`` with
    ``replay=False``, for rank settings without ``batch_size`` or the other way round, and
    for a bad rank, size, window, state or ``timeout``, and for ``continuous=True`` with a rank,
    ``replay`` or ``epochs``, or ``batch_log`` without it.
    """

    def __init__(
        self,
        *,
        memory: int | str = "64MiB",
        segment_size: int | str = "32KiB",
        bind: str = "127.0.0.1",
        secret: str | None = None,
        max_queued: int = 8,
        timeout: float | None = None,
        spill: bool = False,
        replay: bool | None = None,
        epochs: int = 1,
        spill_dir: str | None = None,
        max_spill: int | str | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        batch_size: int | None = None,
        shuffle: bool | Literal["global"] = True,
        seed: int = 0,
        drop_last: bool = False,
        shuffle_window: int | None = None,
        state: dict[str, Any] | None = None,
        job: str | None = None,
        tls: cf.TLSConfig | None = None,
        peer_timeout: float = 30.0,
        continuous: bool = False,
        batch_log: str | os.PathLike[str] | None = None,
    ) -> None:
        if max_queued < 1:
            raise ValueError(f"max_queued must be at least 1, got {max_queued}")
        check_timeout(timeout)
        ranked = batch_size is not None or rank is not None or world_size is not None or job is not None
        opts = None
        found = None
        log = None
        if continuous:
            if ranked or replay is not None or epochs != 1:
                raise ValueError(
                    "continuous=True serves one job after another to one consumer: rank, world_size, "
                    "batch_size, job, replay and epochs do not apply"
                )
            _check_spill(spill, None, 1, spill_dir, max_spill)
            log = BatchLog(_log_path(batch_log, spill_dir))
            if not spill:
                max_spill = 0  # a micro-batch is withheld within ``memory``, never spilled
        elif batch_log is not None:
            raise ValueError("batch_log needs continuous=True")
        if ranked:
            from creditflow.spark.job import find_job

            found = find_job(job) if job is not None or secret is None else None
            rank, world_size = _rank_of(rank, world_size, found is not None)
            opts = _rank_options(
                rank, world_size, batch_size, shuffle, seed, drop_last, shuffle_window, state
            )
            opts = dataclasses.replace(opts, max_queued=max_queued, timeout=timeout)
            if spill or replay is not None or epochs != 1:
                raise ValueError(
                    "a rank always keeps its rows for later epochs: spill, replay and epochs do not apply"
                )
            if found is not None:
                secret = found.secret
        if not continuous and not ranked:
            replay = _check_spill(spill, replay, epochs, spill_dir, max_spill)
        host = bind.strip("[]")
        if bind.count(":") == 1:  # "host:port" (an IPv6 address has more colons)
            raise ValueError(
                f"bind takes a host, not {bind!r}: the receiver's ports are chosen by the system"
            )
        self.secret = secret or secrets.token_hex(32)
        self._timeout = timeout
        self._servers: list[MetricsServer] = []
        self._env = cf.NetworkEnvironment(
            memory=memory,
            segment_size=segment_size,
            bind=f"[{host}]:0" if ":" in host else f"{host}:0",
            secret=self.secret,
            spill_dir=spill_dir,  # both None (the defaults) without spill or a rank
            max_spill=max_spill,
            tls=tls,
            peer_timeout=peer_timeout,
        )
        self._mode: Direct | Spooled | Ranked | Continuous
        try:
            if log is not None:
                self._mode = Continuous(
                    self._env, host=host, secret=self.secret, max_queued=max_queued, log=log, spill=spill
                )
            elif opts is not None:
                self._mode = Ranked(self._env, host=host, secret=self.secret, opts=opts)
                if found is not None:
                    found.register(opts.rank, opts.world, self._mode.address)
            elif spill:
                self._mode = Spooled(
                    self._env, host=host, secret=self.secret, replay=bool(replay), epochs=epochs
                )
            else:
                self._mode = Direct(self._env, host=host, secret=self.secret, max_queued=max_queued)
        except BaseException:
            if hasattr(self, "_mode"):
                self._mode.close()
            self._env.close()
            raise

    @property
    def address(self) -> str:
        """The one address to give :func:`send` (``host:port``)."""
        if isinstance(self._mode, Ranked | Continuous):
            return self._mode.address
        return self._mode.intake.address

    @property
    def timeout(self) -> float | None:
        """The longest :meth:`next` and iteration wait for a batch, in seconds (None: no limit)."""
        return self._timeout

    def next(self, timeout: float | None = None) -> pa.RecordBatch | None:
        """The next batch; None at the end (a rank: of the current epoch). Raises
        :class:`creditflow.TimeoutError` after ``timeout`` seconds (default: the receiver's),
        and the task's error if a partition failed (with ``spill=True`` or a rank: a
        :class:`creditflow.ProducerFailedError` naming it; a rank also when another rank went
        away). With replay, :meth:`next` continues the current pass (the first one if none
        started) and returns None at its end; ``iter(rx)`` starts new ones. A continuous
        receiver's: the next batch of any job (boundaries skipped), None once closed."""
        return self._mode.next(self._timeout if timeout is None else timeout)

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        """The batches until the end. With replay, the whole stream from its first batch,
        ``epochs`` times over (each ``iter(rx)`` starts again). A rank's: the rest of the
        current epoch (a new iteration continues where the last stopped). A continuous
        receiver's: every job's batches, until :meth:`close` (see :meth:`items`)."""
        if isinstance(self._mode, Ranked | Continuous):
            while (batch := self.next()) is not None:
                yield batch
            return
        yield from self._mode.passes(self._timeout)

    def _continuous(self, what: str) -> Continuous:
        if not isinstance(self._mode, Continuous):
            raise ValueError(f"{what} needs Receiver(continuous=True)")
        return self._mode

    def next_item(self, timeout: float | None = None) -> Item | None:
        """A continuous receiver's next batch or :class:`JobDone` boundary (after the last
        batch of each job); None once the receiver closed. Raises
        :class:`creditflow.TimeoutError` after ``timeout`` seconds (default: the receiver's)."""
        return self._continuous("next_item").next_item(self._timeout if timeout is None else timeout)

    def items(self) -> Iterator[Item]:
        """A continuous receiver's stream with its boundaries: every job's batches, then a
        :class:`JobDone` naming the job (and its micro-batch); ends at :meth:`close`."""
        mode = self._continuous("items")
        timeout = self._timeout

        def stream() -> Iterator[Item]:
            while (item := mode.next_item(timeout)) is not None:
                yield item

        return stream()

    def continuous_metrics(self) -> ContinuousMetrics:
        """A continuous receiver's jobs: committed, delivered, replays and failed jobs dropped,
        the backlog and the time its readers paused for the consumer
        (:class:`creditflow.metrics.ContinuousMetrics`)."""
        return self._continuous("continuous_metrics").metrics()

    @property
    def last_batch_ids(self) -> dict[str, int]:
        """A continuous receiver's last micro-batch of each stream (query id; ``""`` when the
        sender named none) that the consumer took whole."""
        return self._continuous("last_batch_ids").log.snapshot()

    def _rank(self, what: str) -> Ranked:
        if not isinstance(self._mode, Ranked):
            raise ValueError(f"{what} needs a rank: Receiver(rank=..., world_size=..., batch_size=...)")
        return self._mode

    @property
    def rank(self) -> int | None:
        """This receiver's rank (None without)."""
        return self._mode._opts.rank if isinstance(self._mode, Ranked) else None

    def set_epoch(self, epoch: int) -> None:
        """A rank: the next iteration reads epoch ``epoch`` from its first batch (epoch 0 is
        streamed from Spark; the later ones are replayed from this rank's memory and spill,
        shuffled by ``(seed, epoch)``). The current epoch again changes nothing."""
        self._rank("set_epoch").set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """A rank's position (plain data, for a checkpoint): ``Receiver(..., state=...)``
        continues at the next batch after a restart. Batches read ahead with
        :meth:`read_ahead` count once :meth:`consumed` says the trainer took them."""
        return self._rank("state_dict").state_dict()

    def read_ahead(self, timeout: float | None = None) -> pa.RecordBatch | None:
        """A rank's next batch for a loader that prefetches (:mod:`creditflow.torch`): it
        counts in :meth:`state_dict` only once :meth:`consumed` says the trainer took it;
        :meth:`unread` gives back what was read ahead and not taken. Otherwise as :meth:`next`."""
        return self._rank("read_ahead").next(self._timeout if timeout is None else timeout, ahead=True)

    def consumed(self) -> None:
        """The trainer took the oldest batch :meth:`read_ahead` returned."""
        self._rank("consumed").consumed()

    def unread(self) -> None:
        """Gives back the batches :meth:`read_ahead` returned that the trainer did not take
        (a loader that stops): the next reads return them first."""
        self._rank("unread").unread()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A live rank goes to ``state``'s epoch and batch, from its memory or spill, without
        Spark (a trainer that rolls back to a checkpoint while the rank processes live on)."""
        self._rank("load_state_dict").load_state_dict(state)

    def rank_metrics(self) -> RankMetrics:
        """A rank's progress and data stall (:class:`creditflow.metrics.RankMetrics`)."""
        return self._rank("rank_metrics").rank_metrics()  # type: ignore[return-value]

    def metrics(self) -> ReceiverMetrics:
        """The receiver's environment metrics (see :meth:`creditflow.NetworkEnvironment.metrics`)
        and, under ``rank``, a rank's :meth:`rank_metrics` (its data stall, the backpressure
        it puts on the tasks; None without a rank). With ``spill=True`` or a rank its
        partitions include the receiver's store while it holds data (see also
        :meth:`spill_metrics`)."""
        env = self._env.metrics()
        rank = self._mode.rank_metrics() if isinstance(self._mode, Ranked) else None
        jobs = self._mode.metrics() if isinstance(self._mode, Continuous) else None
        return {**env, "rank": rank, "continuous": jobs}  # type: ignore[typeddict-item]

    def serve_metrics(self, port: int = 0, addr: str = "127.0.0.1") -> MetricsServer:
        """Serves :meth:`metrics` in the Prometheus text format at ``http://addr:port/metrics``
        (``port=0``: any free port) until the receiver closes: the environment's families and
        a rank's (``creditflow_rank_*``: data stall, backpressure, epoch, memory). Needs
        ``prometheus_client`` (``pip install 'creditflow[metrics]'``)."""
        from creditflow import prometheus

        if self.closed:
            raise cf.ClosedError("the receiver is closed")
        server = prometheus.serve(self, port, addr)
        self._servers.append(server)
        return server

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._env.closed

    def spill_metrics(self) -> SpillMetrics | None:
        """With ``spill=True`` or a rank, the store's metrics (``creditflow.metrics.SpillMetrics``:
        bytes stored, spilled and read back, what it holds in memory and on disk now); None
        without, and for a continuous receiver, whose spools (one per partition attempt) are
        among :meth:`metrics`' partitions, its spill directory under ``metrics()["spill"]``."""
        return self._mode.spill_metrics()

    def close(self) -> None:
        """Stops receiving; open channels are cancelled; with ``spill=True`` or a rank the
        stored stream and its spill file are removed; a rank says goodbye to the others,
        once they have what they read from it (the rows it gives them at the end of epoch 0,
        its deals of the global shuffle; at most ``timeout``). Idempotent."""
        if self._env.closed:
            return
        for server in self._servers:
            server.close()
        self._mode.close()
        self._env.close()


def _log_path(batch_log: str | os.PathLike[str] | None, spill_dir: str | None) -> Path | None:
    """Where a continuous receiver's batch log goes (a relative path: under ``spill_dir``)."""
    if batch_log is None:
        return None
    path = Path(batch_log)
    if not path.is_absolute():
        base = Path(spill_dir) if spill_dir is not None else Path(tempfile.gettempdir()) / "creditflow-spill"
        path = base / path
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _rank_of(rank: int | None, world_size: int | None, from_job: bool) -> tuple[int, int]:
    """The rank and world size, from the environment (``RANK``, ``WORLD_SIZE``) for a job."""
    if from_job:
        rank = int(os.environ["RANK"]) if rank is None and "RANK" in os.environ else rank
        if world_size is None and "WORLD_SIZE" in os.environ:
            world_size = int(os.environ["WORLD_SIZE"])
    if rank is None or world_size is None:
        raise ValueError("a rank needs rank= and world_size= (or RANK and WORLD_SIZE set, with job=)")
    return rank, world_size


def _rank_options(
    rank: int,
    world_size: int,
    batch_size: int | None,
    shuffle: bool | str,
    seed: int,
    drop_last: bool,
    window: int | None,
    state: dict[str, Any] | None,
) -> Options:
    """Checks a rank's settings."""
    if shuffle not in (True, False, "global"):
        raise ValueError(f'shuffle must be True, False or "global", got {shuffle!r}')
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(
            f"rank must be in 0..world_size-1 and world_size >= 1, got rank={rank}, world_size={world_size}"
        )
    if batch_size is None or batch_size < 1:
        raise ValueError(f"a rank needs batch_size >= 1, got {batch_size}")
    if window is not None and window < 1:
        raise ValueError(f"shuffle_window must be at least 1 row, got {window}")
    parsed = None
    if state is not None:
        parsed = RankState.from_dict(state)
        parsed.check(rank, world_size, batch_size, seed, shuffle, drop_last)
    return Options(
        rank=rank,
        world=world_size,
        batch_size=batch_size,
        shuffle=bool(shuffle),
        across=shuffle == "global",
        seed=seed,
        drop_last=drop_last,
        window=window if window is not None else WINDOW_BATCHES * batch_size,
        max_queued=8,
        timeout=None,
        state=parsed,
    )


def _check_spill(
    spill: bool, replay: bool | None, epochs: int, spill_dir: str | None, max_spill: int | str | None
) -> bool:
    """Checks the spilling arguments of :class:`Receiver`; returns whether to replay."""
    if epochs < 1:
        raise ValueError(f"epochs must be at least 1, got {epochs}")
    if not spill:
        given = [
            name
            for name, value in (
                ("replay", replay),
                ("epochs", epochs if epochs != 1 else None),
                ("spill_dir", spill_dir),
                ("max_spill", max_spill),
            )
            if value is not None
        ]
        if given:
            raise ValueError(
                f"{', '.join(given)} need{'s' if len(given) == 1 else ''} spill=True: without it the "
                "receiver keeps nothing (the consumer reads straight from the Spark tasks)"
            )
        return False
    if epochs > 1 and replay is False:
        raise ValueError(f"epochs={epochs} needs replay: without it the stream is read once")
    return epochs > 1 if replay is None else replay


def send(
    df: DataFrame,
    addresses: str | Sequence[str],
    secret: str,
    *,
    via: Literal["executors", "driver"] = "executors",
    memory: int | str = "16MiB",
    segment_size: int | str = "32KiB",
    wire_compression: str | None = None,
    tls: cf.TLSConfig | None = None,
    peer_timeout: float = 30.0,
    timeout: float | None = 600.0,
    monitor: Monitor | None = None,
    batch_id: int | None = None,
    stream: str | None = None,
    host_service: bool | None = None,
) -> list[dict[str, Any]]:
    """Streams ``df`` to the :class:`Receiver` at ``addresses``; returns when it has it all.

    ``addresses`` is one receiver's address, or a list of W addresses, one per rank in rank
    order (``Receiver(rank=r, world_size=W, ...)``): every task then splits its partition
    between the ranks in stripes of 1,024 rows, and every row reaches exactly one rank.

    With ``via="executors"`` (the default) every task streams its partition straight from
    its executor as Spark computes it, with backpressure from the receivers reaching the
    computation; ``memory`` bounds what each task holds in flight (with ``host_service=False``;
    the tasks attached to a host service share its ``spark.creditflow.hostMemory``, and
    ``memory`` bounds what a task's writer holds in place in the task, at least 1 MiB). With
    ``via="driver"`` the driver collects ``df.toArrow()`` (the whole result in driver memory)
    and streams that.

    ``wire_compression`` (``"lz4"``, ``"zstd"``) compresses what the tasks send, as for
    :class:`creditflow.NetworkEnvironment` (pays when the receiver is across a slow link).
    ``tls`` (a :class:`creditflow.TLSConfig`, for receivers made with ``tls``): every task
    serves its partition over TLS with these files, which each executor (or, with
    ``via="driver"``, the driver) reads at these paths; the certificate must be valid for the
    address the receivers reach it at.
    ``peer_timeout``: seconds a receiver's host may acknowledge nothing (a cut link, a
    vanished host) before the connections to it fail and the tasks with them, as for
    :class:`creditflow.NetworkEnvironment` (``0``: the OS's defaults).
    ``timeout`` bounds each wait for buffer space or for the receiver to finish reading, in
    seconds. ``host_service`` (with ``via="executors"``): ``True`` sends through each host's
    creditflow service (one pool for the host, ``spark.creditflow.hostMemory``, default 64 MiB
    per task slot of the host; one connection per host to each receiver), ``False`` from an
    environment per task, ``None`` (the default) as the session's
    ``spark.creditflow.hostService`` says (default true). ``monitor`` receives every task's
    samples (and every rank's, with its data stall). Returns one dict per partition:
    ``partition``, ``attempt``, ``accepted``, ``rows``, ``bytes`` (its batches' Arrow buffers),
    ``seconds``. Raises what the job raised, after telling the receivers (which then raise
    too); a rank that went away is named.

    To a ``Receiver(continuous=True)``, the job commits once it succeeded: only then does
    the consumer get its rows (a failed job is dropped whole). Inside ``foreachBatch``, pass
    the micro-batch's id as ``batch_id``: a micro-batch that the receiver delivered already
    (Spark retries it, or replays it after a restart from its checkpoint) is skipped without
    running a Spark job, and ``send`` returns ``[]``. ``stream`` names the streaming query
    (default: its id, which a classic session's ``foreachBatch`` knows; on Spark Connect pass
    ``stream=query_name_or_id`` when several queries feed one receiver). Raises
    ``ValueError`` for ``batch_id`` to a receiver that is not continuous.
    """
    if batch_id is not None and (isinstance(batch_id, bool) or not isinstance(batch_id, int) or batch_id < 0):
        raise ValueError(f"batch_id must be an int >= 0 (foreachBatch's second argument), got {batch_id!r}")
    if stream is None and batch_id is not None:
        stream = query_of(df)
    if via not in ("executors", "driver"):
        raise ValueError(f'via must be "executors" or "driver", got {via!r}')
    check_task_settings(
        memory=memory,
        segment_size=segment_size,
        wire_compression=wire_compression,
        peer_timeout=peer_timeout,
        timeout=timeout,
    )
    where, ranks = addresses_of(addresses)
    settings = EnvSettings(
        secret=secret,
        memory=memory,
        segment_size=segment_size,
        wire_compression=wire_compression,
        tls=TlsFiles.of(tls),
        peer_timeout=float(peer_timeout),
    )
    plan = SendPlan(
        uuid.uuid4().hex[:12],
        where,
        ranks,
        settings,
        timeout,
        monitor.handle if monitor is not None else None,
        batch_id=batch_id,
        stream=stream,
    )
    if not plan.ranks and is_replay(plan):
        return []  # a micro-batch the receiver has: Spark computes nothing
    if via == "driver":
        return send_from_driver(df, plan)
    if use_host_service(df.sparkSession, host_service):
        spark = df.sparkSession
        plan = dataclasses.replace(plan, app_id=application_id(spark), host_memory=host_memory(spark))
    try:
        # On Connect this runs a probe job over df, which fails where the job would.
        n = prepare(df)
    except BaseException as exc:
        tell_job_failed(plan, exc)
        raise
    plan = register_job(plan, n)
    if plan.replay:
        return []
    try:

        def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            return send_task(plan, batches)

        rows = df.mapInArrow(run, STATS_SCHEMA).collect()
    except BaseException as exc:
        tell_job_failed(plan, exc)
        raise
    stats = [r.asDict() for r in sorted(rows, key=lambda r: (r.partition, r.attempt))]
    end_job(plan, stats)
    return stats
