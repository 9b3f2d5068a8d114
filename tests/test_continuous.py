"""A continuous receiver without Spark: jobs driven through the same task code and control
messages as ``send`` (``stream_partition``, commit, failure), in this process.

Every row carries a unique id, so "every row once" is checked row by row.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import creditflow as cf

pytest.importorskip("pyspark")
import creditflow.spark as cfs
from creditflow.spark._process import EnvSettings
from creditflow.spark._sending import (
    SendPlan,
    is_replay,
    register_job,
    stream_partition,
    tell_job_committed,
    tell_job_failed,
)
from stream_consumer import Consumer

ROWS = 4096


class Sender:
    """Plays the driver and the tasks of ``send(df, rx.address, rx.secret, batch_id=...)``."""

    def __init__(self, rx: cfs.Receiver) -> None:
        self.rx = rx
        self.settings = EnvSettings(
            secret=rx.secret, memory="4MiB", segment_size="32KiB", wire_compression=None, tls=None
        )
        self.env = cf.NetworkEnvironment(memory="4MiB", secret=rx.secret)

    def plan(self, batch_id: int | None, stream: str = "q") -> SendPlan:
        return SendPlan(
            uuid.uuid4().hex[:8],
            (self.rx.address,),
            False,
            self.settings,
            30.0,
            None,
            batch_id=batch_id,
            stream=stream,
            continuous=True,  # as the sink's plans are (register_job sets it for send's)
        )

    def task(
        self, plan: SendPlan, part: int, attempt: int = 0, batches: int = 3, fail_after: int | None = None
    ) -> dict[str, Any]:
        return stream_partition(
            self.env, plan, part, attempt, rows(plan.batch_id or 0, part, batches, fail_after)
        )

    def job(self, batch_id: int | None, parts: int = 2, stream: str = "q") -> str | dict[str, Any]:
        """A whole job; "replay" when the receiver has the micro-batch already."""
        plan = register_job(self.plan(batch_id, stream), parts)
        if plan.replay:
            return "replay"
        for p in range(parts):
            self.task(plan, p)
        return tell_job_committed(plan, dict.fromkeys(range(parts), 0))

    def close(self) -> None:
        self.env.close()


def rows(batch_id: int, part: int, batches: int, fail_after: int | None = None) -> Iterator[pa.RecordBatch]:
    """Partition ``part`` of micro-batch ``batch_id``: ids unique across both."""
    for i in range(batches):
        if fail_after is not None and i == fail_after:
            raise RuntimeError(f"task of partition {part} failed after {i} batches")
        start = batch_id * 1_000_000 + part * 100_000 + i * ROWS
        yield pa.record_batch({"id": np.arange(start, start + ROWS, dtype=np.int64)})


def expected(batch_ids: list[int], parts: int = 2, batches: int = 3) -> np.ndarray:
    return np.sort(
        np.concatenate(
            [b.column("id").to_numpy() for i in batch_ids for p in range(parts) for b in rows(i, p, batches)]
        )
    )


@pytest.fixture
def rx() -> Iterator[cfs.Receiver]:
    receiver = cfs.Receiver(continuous=True, memory="16MiB", timeout=60.0)
    yield receiver
    receiver.close()


@pytest.fixture
def sender(rx: cfs.Receiver) -> Iterator[Sender]:
    s = Sender(rx)
    yield s
    s.close()


def test_a_continuous_receiver_serves_one_job_after_another_with_a_boundary_after_each(
    rx: cfs.Receiver, sender: Sender
) -> None:
    consumer = Consumer(rx)
    for batch_id in range(3):
        assert sender.job(batch_id) == {"ok": True, "rows": 6 * ROWS}
    assert sender.job(None) == {"ok": True, "rows": 6 * ROWS}  # a plain send: no micro-batch
    consumer.wait_jobs(4)
    assert [(d.stream, d.batch_id, d.rows, d.batches) for d in consumer.done] == [
        ("q", 0, 6 * ROWS, 6),
        ("q", 1, 6 * ROWS, 6),
        ("q", 2, 6 * ROWS, 6),
        (None, None, 6 * ROWS, 6),
    ]
    # Each job's rows come before its boundary: the ids seen up to the first boundary are job 0's.
    first = np.sort(np.concatenate(consumer.ids[:6]))
    np.testing.assert_array_equal(first, expected([0]))
    np.testing.assert_array_equal(np.sort(consumer.all_ids()[: 18 * ROWS]), expected([0, 1, 2]))
    # Iteration goes on until the receiver closes.
    assert not consumer.ended.wait(0.3)
    rx.close()
    assert consumer.ended.wait(10)
    assert consumer.error is None
    assert rx.next() is None


def test_a_replayed_micro_batch_is_dropped_and_its_job_never_runs(rx: cfs.Receiver, sender: Sender) -> None:
    consumer = Consumer(rx)
    assert sender.job(0) != "replay"
    assert sender.job(1) != "replay"
    assert sender.job(1) == "replay"  # Spark retried micro-batch 1: it runs nothing
    assert sender.job(0) == "replay"
    assert sender.job(0, stream="another query") != "replay"  # ids of another query do not compare
    consumer.wait_jobs(3)
    m = rx.continuous_metrics()
    assert m["replays_dropped"] == 2
    assert m["jobs_delivered"] == 3
    assert rx.last_batch_ids == {"q": 1, "another query": 0}
    # send asks first, before Spark computes anything
    assert is_replay(sender.plan(1))
    assert not is_replay(sender.plan(2))
    assert not is_replay(sender.plan(None))
    both = np.sort(np.concatenate([expected([0, 1]), expected([0])]))  # q's 0 and 1, the other's 0
    np.testing.assert_array_equal(np.sort(consumer.all_ids()), both)


def test_a_replay_that_reaches_the_commit_is_dropped_there(rx: cfs.Receiver, sender: Sender) -> None:
    """The sink's tasks register without the driver asking first: two runs of one micro-batch
    both send their partitions; the second commit drops its rows."""
    consumer = Consumer(rx)
    first, second = sender.plan(5), sender.plan(5)
    for p in range(2):
        sender.task(first, p)
    assert tell_job_committed(first, {0: 0, 1: 0})["ok"]
    consumer.wait_jobs(1)
    stats = sender.task(second, 0)
    assert not stats["accepted"]  # the task learns it is a replay and sends nothing
    assert tell_job_committed(second, {0: 0}) == {"ok": True, "replay": True}
    time.sleep(0.2)
    assert len(consumer.done) == 1
    assert rx.continuous_metrics()["replays_dropped"] == 1
    np.testing.assert_array_equal(np.sort(consumer.all_ids()), expected([5]))


def test_a_job_that_fails_midway_is_dropped_whole(rx: cfs.Receiver, sender: Sender) -> None:
    consumer = Consumer(rx)
    plan = register_job(sender.plan(0), 2)
    sender.task(plan, 0)
    with pytest.raises(RuntimeError, match="failed after 1 batches"):
        sender.task(plan, 1, fail_after=1)
    tell_job_failed(plan, RuntimeError("the Spark job failed"))
    # The retry of the micro-batch (a new job, as after foreachBatch raised) is delivered once.
    assert sender.job(0) == {"ok": True, "rows": 6 * ROWS}
    consumer.wait_jobs(1)
    time.sleep(0.2)
    assert [d.batch_id for d in consumer.done] == [0]
    np.testing.assert_array_equal(np.sort(consumer.all_ids()), expected([0]))
    m = rx.continuous_metrics()
    assert m["jobs_dropped"] == 1
    assert m["rows_dropped"] == 3 * ROWS  # partition 0's whole attempt; partition 1's broken one is gone
    assert m["attempts_failed"] == 1
    assert m["jobs_staged"] == m["partitions_staged"] == 0


def test_a_broken_attempt_is_replaced_by_the_next_attempt_of_its_partition(
    rx: cfs.Receiver, sender: Sender
) -> None:
    consumer = Consumer(rx)
    plan = register_job(sender.plan(0), 2)
    sender.task(plan, 0)
    with pytest.raises(RuntimeError):
        sender.task(plan, 1, attempt=0, fail_after=2)  # 2 of 3 batches sent, then broken
    again = sender.task(plan, 1, attempt=1)  # Spark's retry of the task
    assert again["accepted"]
    late = sender.task(plan, 1, attempt=2)  # a speculative copy, also read whole
    assert late["accepted"]
    assert tell_job_committed(plan, {0: 0, 1: 1})["ok"]  # Spark kept attempt 1
    consumer.wait_jobs(1)
    np.testing.assert_array_equal(np.sort(consumer.all_ids()), expected([0]))
    assert rx.continuous_metrics()["attempts_failed"] == 2  # the broken one, and the copy not kept


def test_an_attempt_that_ended_cleanly_is_not_delivered_when_spark_kept_another(
    rx: cfs.Receiver, sender: Sender
) -> None:
    """A task whose input ended early (an upstream Python worker died) ends its stream cleanly
    with part of its partition; Spark retries it and keeps the retry: only that is delivered."""
    consumer = Consumer(rx)
    plan = register_job(sender.plan(0), 1)
    early = stream_partition(sender.env, plan, 0, 0, rows(0, 0, 1))  # 1 batch of 3, ended cleanly
    assert early["accepted"]
    assert sender.task(plan, 0, attempt=1)["accepted"]
    assert tell_job_committed(plan, {0: 1})["ok"]
    consumer.wait_jobs(1)
    np.testing.assert_array_equal(np.sort(consumer.all_ids()), expected([0], parts=1))


def test_a_commit_without_every_partition_whole_fails_and_delivers_nothing(
    rx: cfs.Receiver, sender: Sender
) -> None:
    consumer = Consumer(rx)
    plan = register_job(sender.plan(0), 2)
    sender.task(plan, 0)
    with pytest.raises(RuntimeError, match=r"partitions \[1\] were not received whole"):
        tell_job_committed(plan, {0: 0, 1: 0})
    assert sender.job(0) != "replay"
    consumer.wait_jobs(1)
    np.testing.assert_array_equal(np.sort(consumer.all_ids()), expected([0]))


def test_the_batch_log_keeps_the_guarantee_across_a_restart_of_the_consumer(tmp_path: Path) -> None:
    first = cfs.Receiver(continuous=True, spill=True, spill_dir=str(tmp_path), batch_log="q1.json")
    sender = Sender(first)
    consumer = Consumer(first)
    assert sender.job(0) != "replay"
    assert sender.job(1) != "replay"
    consumer.wait_jobs(2)
    first.close()
    sender.close()
    log = tmp_path / "q1.json"
    assert json.loads(log.read_text()) == {"version": 1, "streams": {"q": 1}}

    second = cfs.Receiver(continuous=True, spill=True, spill_dir=str(tmp_path), batch_log="q1.json")
    try:
        sender = Sender(second)
        again = Consumer(second)
        assert sender.job(1) == "replay"  # Spark replays micro-batch 1 after its own restart
        assert sender.job(2) != "replay"
        again.wait_jobs(1)
        assert [d.batch_id for d in again.done] == [2]
        both = np.concatenate([consumer.all_ids(), again.all_ids()])
        np.testing.assert_array_equal(np.sort(both), expected([0, 1, 2]))
        sender.close()
    finally:
        second.close()


def test_a_batch_id_is_complete_only_once_the_consumer_took_the_whole_micro_batch(
    rx: cfs.Receiver, sender: Sender
) -> None:
    assert sender.job(0) != "replay"
    assert rx.last_batch_ids == {}  # committed, not yet taken
    items = [rx.next_item(timeout=10) for _ in range(7)]
    assert isinstance(items[-1], cfs.JobDone)
    assert rx.last_batch_ids == {"q": 0}


def test_a_damaged_batch_log_is_refused_with_what_to_do(tmp_path: Path) -> None:
    (tmp_path / "log.json").write_text("{not json")
    with pytest.raises(ValueError, match="cannot read the receiver's batch log .*remove it"):
        cfs.Receiver(continuous=True, batch_log=str(tmp_path / "log.json"))


def test_a_micro_batch_larger_than_memory_fails_clearly_without_spill_and_spills_with_it(
    tmp_path: Path,
) -> None:
    small = cfs.Receiver(continuous=True, memory="1MiB", timeout=30.0)
    sender = Sender(small)
    try:
        plan = register_job(sender.plan(0), 1)
        with pytest.raises(RuntimeError, match="does not fit in the receiver's memory.*spill=True"):
            sender.task(plan, 0, batches=40)  # 40 x 32 KiB: beyond 1 MiB, withheld until the commit
        with pytest.raises(RuntimeError, match="not received whole"):
            tell_job_committed(plan, {0: 0})
        assert small.continuous_metrics()["rows_committed"] == 0
    finally:
        sender.close()
        small.close()

    spilling = cfs.Receiver(continuous=True, memory="1MiB", spill=True, spill_dir=str(tmp_path), timeout=30.0)
    sender = Sender(spilling)
    try:
        consumer = Consumer(spilling)
        plan = register_job(sender.plan(0), 1)
        sender.task(plan, 0, batches=40)
        spill = spilling.metrics()["spill"]
        assert spill is not None
        assert spill["disk_bytes"] > 0
        assert tell_job_committed(plan, {0: 0})["ok"]
        consumer.wait_jobs(1)
        np.testing.assert_array_equal(np.sort(consumer.all_ids()), expected([0], parts=1, batches=40))
    finally:
        sender.close()
        spilling.close()


def test_a_slow_consumer_holds_the_tasks_back_within_max_queued_batches() -> None:
    """Backpressure: while the consumer has more than ``max_queued`` committed batches to take,
    the receiver stops reading the next job, so its task waits for the consumer."""
    rx = cfs.Receiver(continuous=True, max_queued=2, timeout=60.0)
    sender = Sender(rx)
    try:
        assert sender.job(0, parts=1) != "replay"  # 3 batches committed, none taken
        plan = register_job(sender.plan(1), 1)
        stats: dict[str, Any] = {}
        task = threading.Thread(target=lambda: stats.update(sender.task(plan, 0)))
        task.start()
        task.join(1.0)
        assert task.is_alive(), "the task finished while the consumer was 3 batches behind"
        assert rx.continuous_metrics()["backlog_batches"] == 3
        assert rx.next(timeout=10) is not None  # the consumer takes one: 2 left, the task goes on
        task.join(30)
        assert not task.is_alive()
        assert stats["accepted"]
        assert rx.continuous_metrics()["paused_seconds"] > 0
        assert tell_job_committed(plan, {0: 0})["ok"]
    finally:
        sender.close()
        rx.close()


def test_continuous_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="continuous=True serves one job after another"):
        cfs.Receiver(continuous=True, rank=0, world_size=1, batch_size=4)
    with pytest.raises(ValueError, match="continuous=True serves one job after another"):
        cfs.Receiver(continuous=True, spill=True, epochs=2)
    with pytest.raises(ValueError, match="max_spill needs spill=True"):
        cfs.Receiver(continuous=True, max_spill="1GiB")
    with pytest.raises(ValueError, match="batch_log needs continuous=True"):
        cfs.Receiver(batch_log="x.json")
    with pytest.raises(ValueError, match="needs Receiver\\(continuous=True\\)"):
        cfs.Receiver().items()
    with pytest.raises(ValueError, match="batch_id must be an int >= 0"):
        cfs.send(None, "127.0.0.1:1", "x", batch_id=-1)  # type: ignore[arg-type]


def test_batch_id_to_a_receiver_that_is_not_continuous_is_refused() -> None:
    rx = cfs.Receiver()
    try:
        settings = EnvSettings(
            secret=rx.secret, memory="4MiB", segment_size="32KiB", wire_compression=None, tls=None
        )
        plan = SendPlan("j", (rx.address,), False, settings, 30.0, None, batch_id=0, stream="q")
        with pytest.raises(ValueError, match="not a continuous one"):
            register_job(plan, 1)
        with pytest.raises(cf.ProducerFailedError, match="not a continuous one"):
            rx.next(timeout=10)  # told, instead of waiting for the job
    finally:
        rx.close()


def test_the_sink_checks_its_options_when_the_query_starts() -> None:
    from creditflow.spark.sink import CreditflowDataSource

    source = CreditflowDataSource({"address": "127.0.0.1:1"})
    with pytest.raises(ValueError, match=r"needs the options \['secret'\]"):
        source.streamWriter(None, False)  # type: ignore[arg-type]
    source = CreditflowDataSource({"address": "127.0.0.1:1", "secret": "s", "adress": "x"})
    with pytest.raises(ValueError, match=r"does not take the options \['adress'\]"):
        source.streamWriter(None, False)  # type: ignore[arg-type]
    ok = CreditflowDataSource(
        {"Address": "127.0.0.1:1", "secret": "s", "checkpointLocation": "/c", "timeout": "5"}
    )
    assert ok.streamWriter(None, False).timeout == 5.0  # type: ignore[arg-type]
    quick = CreditflowDataSource({"address": "127.0.0.1:1", "secret": "s", "peer_timeout": "2.5"})
    assert quick.streamWriter(None, False).env.peer_timeout == 2.5  # type: ignore[arg-type]
    for bad in ("soon", "0"):
        source = CreditflowDataSource({"address": "127.0.0.1:1", "secret": "s", "timeout": bad})
        with pytest.raises(ValueError, match=f"timeout must be a positive number of seconds, got '{bad}'"):
            source.streamWriter(None, False)  # type: ignore[arg-type]
    for bad in ("soon", "-1", "nan"):
        source = CreditflowDataSource({"address": "127.0.0.1:1", "secret": "s", "peer_timeout": bad})
        with pytest.raises(ValueError, match=f"peer_timeout must be a non-negative number .* got '{bad}'"):
            source.streamWriter(None, False)  # type: ignore[arg-type]
    assert CreditflowDataSource.name() == "creditflow"
