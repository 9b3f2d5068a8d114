"""A rank's side of ``send`` without a Spark job: attempt fencing (one attempt of a partition
at a time, an older grant turned away), the stall and backpressure a rank reports, the error
the ranks are told, and the ranks' arguments. Each test registers a one-partition job with a
real ``Receiver`` rank and plays the task's part by hand."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import creditflow as cf

pytestmark = pytest.mark.spark

pytest.importorskip("pyspark")
import creditflow.spark as cfs  # noqa: E402


def lone_rank_job(rx: cfs.Receiver, secret: str, job: str, env: cf.NetworkEnvironment) -> dict[str, Any]:
    """Registers job ``job`` of one partition with ``rx`` (rank 0 of 1) as ``send`` would;
    returns what a task of it registers its partition with (but its attempt and id)."""
    from creditflow.spark import _messages

    message = {
        "kind": "job",
        "job": job,
        "num_partitions": 1,
        "world_size": 1,
        "rank": 0,
        "ranks": [rx.address],
    }
    assert _messages.send(rx.address, secret, message, reply=True)["accept"]
    return {"kind": "partition", "job": job, "partition": 0, "address": env.address}


@contextlib.contextmanager
def lone_rank_partition(secret: str) -> Iterator[tuple[cfs.Receiver, cf.ResultPartition, dict[str, Any]]]:
    """A rank of one with job ``"j"`` of one partition registered, a partition ``p`` of an
    environment, and the message its tasks register it with (but the attempt)."""
    rx = cfs.Receiver(rank=0, world_size=1, batch_size=10, secret=secret)
    try:
        with cf.NetworkEnvironment(memory="2MiB", secret=secret) as env:
            part = env.create_partition("p", 1)
            try:
                yield rx, part, {**lone_rank_job(rx, secret, "j", env), "partition_id": part.id}
            finally:
                part.release()
    finally:
        rx.close()


def test_a_second_attempt_waits_for_the_first_and_continues_after_it() -> None:
    """Attempt fencing: rank 0 grants a partition to one attempt at a time. A second attempt
    (speculative, or a retry) is answered only once the first one's stream settled, and
    then continues after the rows the rank has; a grant older than the one a rank reads is
    refused."""
    from creditflow.spark import _messages

    secret = "k" * 64
    answers: dict[str, Any] = {}
    with lone_rank_partition(secret) as (rx, part, reg):
        answers["first"] = _messages.send(rx.address, secret, {**reg, "attempt": 0}, reply=True)

        def second() -> None:
            answers["second"] = _messages.send(
                rx.address, secret, {**reg, "attempt": 1, "partition_id": "p2"}, reply=True, timeout=60
            )

        waiting = threading.Thread(target=second)
        waiting.start()
        with cf.RecordWriter(part, cf.ForwardPartitioner()) as w:  # the first attempt's 25 rows
            w.write(pa.record_batch([pa.array(np.arange(25))], names=["id"]), subpartition=0)
        waiting.join(60)
        stale = {**reg, "attempt": 2, "grant": 1}
        answers["stale"] = _messages.send(rx.address, secret, stale, reply=True)
    assert answers["first"]["accept"]
    assert answers["first"]["grant"] == 1
    assert answers["first"]["skip"] == 0
    second_answer = answers["second"]
    assert second_answer["accept"], second_answer
    assert second_answer["grant"] == 2
    assert second_answer["skip"] == 25, "answered after the first attempt's rows were kept"
    assert not answers["stale"]["accept"]
    assert "newer attempt" in answers["stale"]["reason"]


def test_an_attempt_older_than_the_granted_one_is_turned_away_at_once() -> None:
    """A task attempt whose worker asks for its partition only after Spark started a newer
    attempt (its input ended early when an upstream worker died, and it was slow to start)
    is turned away, whether the newer attempt's stream is live or ended: a grant to it would
    take the partition from the newer attempt mid-stream. A retry newer than both continues
    after the rows the rank has."""
    from creditflow.spark import _messages

    secret = "k" * 64
    answers: dict[str, Any] = {}
    with lone_rank_partition(secret) as (rx, part, reg):
        answers["newer"] = _messages.send(rx.address, secret, {**reg, "attempt": 1}, reply=True)
        # While the newer attempt's stream is live: answered at once (not once it settles).
        older = {**reg, "attempt": 0, "partition_id": "p0"}
        answers["older, live"] = _messages.send(rx.address, secret, older, reply=True, timeout=10)
        with cf.RecordWriter(part, cf.ForwardPartitioner()) as w:  # the newer attempt's 25 rows
            w.write(pa.record_batch([pa.array(np.arange(25))], names=["id"]), subpartition=0)
        delivered = {"kind": "delivered", "job": "j", "partition": 0, "grant": 1, "attempt": 1}
        answers["delivered"] = _messages.send(rx.address, secret, delivered, reply=True, timeout=60)
        answers["older, ended"] = _messages.send(rx.address, secret, older, reply=True, timeout=10)
        retry = {**reg, "attempt": 2, "partition_id": "p2"}
        answers["retry"] = _messages.send(rx.address, secret, retry, reply=True, timeout=10)
    assert answers["newer"]["accept"], answers["newer"]
    assert answers["newer"]["grant"] == 1, answers["newer"]
    for key in ("older, live", "older, ended"):
        assert not answers[key]["accept"], (key, answers[key])
        assert not answers[key].get("retry"), (key, answers[key])
        assert "attempt 0 asked after attempt 1" in answers[key]["reason"], (key, answers[key])
    assert answers["delivered"]["ok"], "the newer attempt kept the partition"
    assert answers["retry"]["accept"], answers["retry"]
    assert (answers["retry"]["grant"], answers["retry"]["skip"]) == (2, 25)


def test_a_rank_reports_its_data_stall_and_the_tasks_backpressure() -> None:
    """``rx.metrics()["rank"]`` and ``rx.serve_metrics()``: the trainer waits for data (the
    data stall) until a task sends; then the trainer stops taking batches and the task waits
    for it (the backpressure the rank puts on the tasks), and the rank names the trainer."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from creditflow.spark import _messages
    from helpers import poll

    secret = "p" * 64
    rx = cfs.Receiver(rank=0, world_size=1, batch_size=100, secret=secret, max_queued=1, shuffle=False)
    env = cf.NetworkEnvironment(memory="2MiB", secret=secret)
    got: list[pa.RecordBatch] = []
    try:
        reg = lone_rank_job(rx, secret, "m", env)
        part = env.create_partition("p", 1)
        assert _messages.send(rx.address, secret, {**reg, "attempt": 0, "partition_id": "p"}, reply=True)[
            "accept"
        ]
        trainer = threading.Thread(target=lambda: got.append(rx.next(timeout=60)))
        trainer.start()
        poll("the trainer waits for data", lambda: rx.rank_metrics()["stall_total"] > 0)

        def task() -> None:
            with contextlib.suppress(cf.CreditflowError):
                w = cf.RecordWriter(part, cf.ForwardPartitioner())
                for i in range(200):
                    w.write(pa.record_batch({"id": np.arange(i * 100, (i + 1) * 100)}), timeout=60)

        threading.Thread(target=task, daemon=True).start()
        trainer.join(60)
        assert [b.num_rows for b in got] == [100], "the trainer got a batch"
        pressed = poll(
            "the task waits for the trainer", lambda: rx.rank_metrics()["backpressure_total"] > 1.0
        )
        assert pressed
        m = rx.metrics()["rank"]
        assert m is not None
        assert m["stall_total"] > 0
        assert m["backpressure_ms_per_second"] > 500
        assert m["bottleneck"] == "trainer"
        server = rx.serve_metrics()
        text = urllib.request.urlopen(server.url, timeout=10).read().decode()
        fams = {f.name: f for f in text_string_to_metric_families(text)}
        for name in ("creditflow_rank_data_stall_seconds", "creditflow_rank_backpressure_seconds"):
            (sample,) = [x for x in fams[name].samples if x.name.endswith("_total")]
            assert sample.labels == {"env": rx.metrics()["address"], "rank": "0"}
            assert sample.value > 0, name
        assert fams["creditflow_rank_backpressure_ratio"].samples[0].value > 0.5
        assert fams["creditflow_segments"].samples, "the environment's families too"
    finally:
        rx.close()
        env.close()
    assert server.closed, "closing the receiver stops its server"


def test_the_ranks_are_told_the_task_s_own_error_not_the_jvm_s_wrapping() -> None:
    from creditflow.spark._sending import cause_of

    wrapped = RuntimeError(
        "An error occurred while calling o57.collectToPython.\n"
        "org.apache.spark.SparkException: Job aborted due to stage failure: Task 1 failed 4 times\n"
        "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        '  File "_sending.py", line 128, in _register\n'
        "ConnectionError: rank 1's receiver at 127.0.0.1:4000 went away: refused\n"
        "\tat org.apache.spark.api.python.BasePythonRunner.handle(PythonRunner.scala:1097)\n"
        "java.lang.IllegalStateException: some JVM detail\n"
    )
    assert cause_of(wrapped) == "ConnectionError: rank 1's receiver at 127.0.0.1:4000 went away: refused"
    assert cause_of(ValueError("plain words")) == "plain words"


def test_rank_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        cfs.Receiver(rank=0, world_size=2)
    with pytest.raises(ValueError, match="rank must be in"):
        cfs.Receiver(rank=2, world_size=2, batch_size=4, secret="x")
    with pytest.raises(ValueError, match="spill, replay and epochs"):
        cfs.Receiver(rank=0, world_size=1, batch_size=4, secret="x", spill=True)
    with pytest.raises(ValueError, match="needs a rank"):
        cfs.Receiver().set_epoch(1)
    with pytest.raises(ValueError, match="addresses repeat"):
        cfs.send(None, ["a:1", "a:1"], "x")  # type: ignore[arg-type]
