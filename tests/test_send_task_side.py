"""``send``'s task side driven without Spark, against a real ``Receiver``: what a receiver
is told when the job fails, a broken connection, Spark's retries continuing a partition after
the rows delivered (and the check that a retry computed the same rows), a partition cut
short, a failed stream, a consumer that closes at the end, and receivers that are gone.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("pyspark")
from creditflow.spark._messages import Inbox, Message
from creditflow.spark._sending import tell_job_failed
from helpers import poll


def rows(n: int) -> Any:
    """``n`` rows of ``x`` = 0, 1, ... in batches of 1,000."""
    import pyarrow as pa

    for start in range(0, n, 1000):
        yield pa.record_batch({"x": pa.array(range(start, start + 1000))})


def plan_to(address: str, job: str, secret: str = "k" * 32) -> Any:
    """A send's plan to the one receiver at ``address``."""
    from creditflow.spark._process import EnvSettings
    from creditflow.spark._sending import SendPlan

    return SendPlan(job, (address,), False, EnvSettings(secret=secret), None, None)


def test_telling_a_gone_receiver_that_the_job_failed_leaves_the_job_s_error_to_raise(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``send`` tells its receiver when the job fails and raises the job's error; a receiver
    that is gone must not turn that error into a ConnectionRefusedError."""
    inbox = Inbox(lambda m: None, host="127.0.0.1", key="k" * 32, name="test-inbox")
    address = inbox.address
    inbox.close()  # nobody listens there any more

    def job() -> None:
        try:
            raise ValueError("the job's own error")
        except ValueError as exc:
            tell_job_failed(plan_to(address, "job-1"), exc)
            raise

    with pytest.raises(ValueError, match="the job's own error"):
        job()
    assert f"could not tell the receiver at {address} that the job failed" in caplog.text


def test_a_reachable_receiver_is_told_that_the_job_failed() -> None:
    got: list[Message] = []
    inbox = Inbox(got.append, host="127.0.0.1", key="k" * 32, name="test-inbox")
    try:
        tell_job_failed(plan_to(inbox.address, "job-2"), RuntimeError("boom"))
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            time.sleep(0.01)
        assert got == [{"kind": "job_failed", "job": "job-2", "error": "boom"}]
    finally:
        inbox.close()


PRODUCER = """
import os, sys, time
import pyarrow as pa
import creditflow as cf
env = cf.NetworkEnvironment(secret=sys.argv[1])
part = env.create_partition("p", 1)
w = cf.RecordWriter(part, cf.ForwardPartitioner())
w.write(pa.record_batch({"x": pa.array(range(1000))}))
w.flush()
print(env.address, flush=True)
sys.stdin.readline()
os._exit(1)  # as a PySpark worker whose task failed: at once, nothing closed
"""


@contextlib.contextmanager
def dying_producer(secret: str) -> Iterator[tuple[str, Callable[[], None]]]:
    """A process that wrote 1,000 rows (``x`` = 0..999) to its partition ``p``: its
    environment's address, and a function that makes it exit at once and waits for it."""
    import subprocess
    import sys

    with subprocess.Popen(
        [sys.executable, "-c", PRODUCER, secret], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stdout is not None
        assert proc.stdin is not None
        stdin = proc.stdin

        def die() -> None:
            stdin.write("\n")
            stdin.flush()
            proc.wait(30)

        yield proc.stdout.readline().strip(), die


def test_a_broken_connection_gives_way_to_the_job_s_error() -> None:
    """A failed Spark task's worker exits at once, so the receiver may see its connection
    break before the driver's word that the job failed arrives: the consumer must raise the
    job's error, not the broken connection."""
    import creditflow as cf
    import creditflow.spark as cfs
    from creditflow.spark import _messages

    with cfs.Receiver(timeout=60) as rx, dying_producer(rx.secret) as (address, die):
        job = {"kind": "job", "job": "j1", "num_partitions": 1}
        assert _messages.send(rx.address, rx.secret, job, reply=True)["accept"]
        part = {"kind": "partition", "job": "j1", "partition": 0, "address": address, "partition_id": "p"}
        assert _messages.send(rx.address, rx.secret, part, reply=True)["accept"]
        first = rx.next(timeout=30)
        assert first is not None
        assert first.num_rows == 1000
        die()
        time.sleep(0.5)  # the connection is broken by now; the job's failure comes after
        failed = {"kind": "job_failed", "job": "j1", "error": "the source broke"}
        _messages.send(rx.address, rx.secret, failed)
        with pytest.raises(cf.ProducerFailedError, match="the source broke"):
            rx.next(timeout=30)


def test_a_task_whose_input_breaks_is_continued_by_its_retry_after_the_rows_delivered() -> None:
    """A task's own error ends its channel (and it tells the receiver): the stream does not
    fail, since Spark may try the task again; the retried attempt skips the rows the consumer
    has and sends the rest, so every row arrives once, and the stream ends on the driver's
    word that the job succeeded."""
    import pyarrow as pa

    import creditflow as cf
    import creditflow.spark as cfs
    from creditflow.spark._sending import register_job, stream_partition, tell_job_done

    with cfs.Receiver(timeout=60) as rx, cf.NetworkEnvironment(secret=rx.secret) as env:

        def breaks() -> Any:
            yield pa.record_batch({"x": pa.array(range(1000))})
            first = rx.next(timeout=30)  # the receiver reads the channel by now
            assert first is not None
            assert first.num_rows == 1000
            yield pa.record_batch({"x": pa.array(range(1000, 1500))})
            raise RuntimeError("the source broke")

        plan = register_job(plan_to(rx.address, "j1", rx.secret), 1)
        with pytest.raises(RuntimeError, match="the source broke"):
            stream_partition(env, plan, 0, 0, breaks())
        retry = stream_partition(env, plan, 0, 1, rows(5000))
        assert retry["accepted"], retry
        assert retry["rows"] == 5000, "an attempt counts the rows it skipped"
        tell_job_done(plan, [retry])
        rest = pa.concat_arrays([b.column(0) for b in rx])
    # The second batch of attempt 0 may or may not have been read before its failure.
    assert rest.to_pylist() == list(range(1000, 5000))


def test_a_retry_that_computes_other_rows_fails_the_stream_instead_of_continuing() -> None:
    """A retry whose rows differ from the attempt it continues (a DataFrame whose order after
    a shuffle is not the same twice) would deliver some rows twice and lose others: its row
    at the resume point differs from the last one delivered, so the task raises and the
    consumer gets why, after the rows delivered."""
    import pyarrow as pa

    import creditflow as cf
    import creditflow.spark as cfs
    from creditflow.spark._sending import register_job, stream_partition

    def reordered(n: int) -> Any:
        for start in range(0, n, 1000):
            yield pa.record_batch({"x": pa.array(range(start + 999, start - 1, -1))})

    with cfs.Receiver(timeout=60) as rx, cf.NetworkEnvironment(secret=rx.secret) as env:
        plan = register_job(plan_to(rx.address, "j1", rx.secret), 1)
        first = stream_partition(env, plan, 0, 0, rows(2000))  # ended early (cleanly)
        with pytest.raises(RuntimeError, match="partition 0: attempt 1 computed other rows"):
            stream_partition(env, plan, 0, 1, reordered(5000))
        got = [rx.next(timeout=30) for _ in range(2)]
        with pytest.raises(cf.ProducerFailedError, match="its row 0 differs from the one delivered"):
            rx.next(timeout=30)
    assert first["rows"] == 2000
    assert pa.concat_arrays([b.column(0) for b in got if b is not None]).to_pylist() == list(range(2000))


def test_a_retry_that_keeps_the_last_row_delivered_in_place_but_not_the_others_fails() -> None:
    """The check looks at more than the row where the retry resumes: rows 0 .. 999 in another
    order with row 1,999 in place (the last delivered) fail it too, at row 0."""
    import pyarrow as pa

    import creditflow as cf
    import creditflow.spark as cfs
    from creditflow.spark._sending import register_job, stream_partition

    def first_batch_reversed(n: int) -> Any:
        for i, batch in enumerate(rows(n)):
            yield pa.record_batch({"x": pa.array(range(999, -1, -1))}) if i == 0 else batch

    with cfs.Receiver(timeout=60) as rx, cf.NetworkEnvironment(secret=rx.secret) as env:
        plan = register_job(plan_to(rx.address, "j1", rx.secret), 1)
        stream_partition(env, plan, 0, 0, rows(2000))  # ended early (cleanly)
        with pytest.raises(RuntimeError, match="its row 0 differs from the one delivered"):
            stream_partition(env, plan, 0, 1, first_batch_reversed(5000))
        for _ in range(2):
            assert rx.next(timeout=30) is not None
        with pytest.raises(cf.ProducerFailedError, match="computed other rows"):
            rx.next(timeout=30)


def test_a_killed_task_is_continued_by_its_retry_and_a_stale_attempt_turned_away() -> None:
    """A task's worker killed mid-stream (its connection breaks, nothing said): its retry
    continues after the rows delivered; an attempt older than one that asked (a late
    speculative copy) is turned away and fails its task rather than succeed with nothing."""
    import pyarrow as pa

    import creditflow as cf
    import creditflow.spark as cfs
    from creditflow.spark import _messages
    from creditflow.spark._sending import register_job, stream_partition, tell_job_done

    with (
        cfs.Receiver(timeout=60) as rx,
        cf.NetworkEnvironment(secret=rx.secret) as env,
        dying_producer(rx.secret) as (address, die),
    ):
        plan = register_job(plan_to(rx.address, "j1", rx.secret), 1)
        part = {"kind": "partition", "job": "j1", "partition": 0, "address": address, "partition_id": "p"}
        assert _messages.send(rx.address, rx.secret, part, reply=True)["accept"]
        first = rx.next(timeout=30)
        assert first is not None
        assert first.num_rows == 1000
        die()  # killed: its connection breaks
        retry = stream_partition(env, plan, 0, 2, rows(3000))
        with pytest.raises(RuntimeError, match="attempt 1 asked after attempt 2"):
            stream_partition(env, plan, 0, 1, rows(3000))
        tell_job_done(plan, [retry])
        rest = pa.concat_arrays([b.column(0) for b in rx])
    assert rest.to_pylist() == list(range(1000, 3000))


def test_a_task_stopped_by_the_failed_job_gives_way_to_the_job_s_error() -> None:
    """When one task fails the job, Spark stops the others, whose own failures (a cut input
    stream) may reach the receiver before the driver's word that the job failed: the consumer
    must raise the job's error, its cause, not the symptom."""
    import threading

    import pyarrow as pa

    import creditflow as cf
    import creditflow.spark as cfs
    from creditflow.spark import _messages
    from creditflow.spark._sending import register_job, stream_partition

    with cfs.Receiver(timeout=60) as rx, cf.NetworkEnvironment(secret=rx.secret) as env:
        plan = register_job(plan_to(rx.address, "j1", rx.secret), 2)

        def batches() -> Any:
            yield pa.record_batch({"x": pa.array(range(1000))})
            first = rx.next(timeout=30)  # the receiver reads the channel by now
            assert first is not None
            raise ValueError("Tried reading schema message, was null or length 0")

        def job_fails_later() -> None:
            time.sleep(0.5)  # the stopped task's failure is at the receiver by now
            failed = {"kind": "job_failed", "job": "j1", "error": "RuntimeError: the source broke"}
            _messages.send(rx.address, rx.secret, failed)

        with pytest.raises(ValueError, match="schema message"):
            stream_partition(env, plan, 0, 0, batches())
        teller = threading.Thread(target=job_fails_later)
        teller.start()
        cause = "the Spark job failed: RuntimeError: the source broke"
        with pytest.raises(cf.ProducerFailedError, match=cause):
            rx.next(timeout=30)
        teller.join()


def test_a_partition_cut_short_by_an_early_end_of_input_is_continued_or_fails() -> None:
    """A task whose upstream Python worker died sees its input end early and ends its channel
    cleanly with part of its partition. The receiver holds its stream's end for the driver's
    word with each partition's rows: Spark's retry continues after the rows it has (every row
    once); without one, short of the rows, send and the consumer both raise, naming the
    partition."""
    import pyarrow as pa

    import creditflow as cf
    import creditflow.spark as cfs
    from creditflow.spark._sending import register_job, stream_partition, tell_job_done

    with cfs.Receiver(timeout=60, max_queued=16) as rx, cf.NetworkEnvironment(secret=rx.secret) as env:
        plan = register_job(plan_to(rx.address, "j1", rx.secret), 2)
        whole = stream_partition(env, plan, 0, 0, rows(5000))
        early = stream_partition(env, plan, 1, 0, rows(1000))  # the input ended after 1 batch
        got = [rx.next(timeout=30) for _ in range(6)]
        with pytest.raises(cf.TimeoutError):
            rx.next(timeout=0.5)  # every channel ended, but the driver has not said so yet
        retry = stream_partition(env, plan, 1, 1, rows(5000))
        tell_job_done(plan, [whole, retry])
        got += list(rx)
    assert (whole["accepted"], early["accepted"], retry["accepted"]) == (True, True, True)
    values = pa.concat_arrays([b.column(0) for b in got if b is not None]).to_pylist()
    assert sorted(values) == sorted(list(range(5000)) * 2), "every row of both partitions once"

    with cfs.Receiver(timeout=60, max_queued=16) as rx, cf.NetworkEnvironment(secret=rx.secret) as env:
        plan = register_job(plan_to(rx.address, "j2", rx.secret), 2)
        whole = stream_partition(env, plan, 0, 0, rows(5000))
        early = stream_partition(env, plan, 1, 0, rows(1000))
        with pytest.raises(RuntimeError, match="partition 1: 1000 of 5000 rows"):
            tell_job_done(plan, [whole, {**early, "rows": 5000}])
        with pytest.raises(cf.ProducerFailedError, match="partition 1: 1000 of 5000 rows"):
            list(rx)

    with cfs.Receiver(timeout=60, max_queued=16) as rx, cf.NetworkEnvironment(secret=rx.secret) as env:
        plan = register_job(plan_to(rx.address, "j3", rx.secret), 1)
        stats = stream_partition(env, plan, 0, 0, rows(3000))
        tell_job_done(plan, [stats])
        assert sum(b.num_rows for b in rx) == 3000


def test_a_failed_stream_stops_reading_the_other_partitions() -> None:
    """Once the driver says the job failed, the stream failed and its consumer stops taking
    batches: the receiver stops reading the other partitions, so that their tasks end at once
    instead of waiting until their timeout for a queue nobody empties, and an attempt that
    asks afterwards is turned away."""
    import dataclasses

    import pyarrow as pa

    import creditflow as cf
    import creditflow.spark as cfs
    from creditflow.spark._sending import register_job, stream_partition, tell_job_failed

    def breaks() -> Any:
        yield pa.record_batch({"x": pa.array(range(1000))})
        raise RuntimeError("the source broke")

    with cfs.Receiver(timeout=60, max_queued=2) as rx, cf.NetworkEnvironment(secret=rx.secret) as env:
        plan = dataclasses.replace(register_job(plan_to(rx.address, "j1", rx.secret), 2), timeout=20)
        with pytest.raises(RuntimeError, match="the source broke"):
            stream_partition(env, plan, 1, 0, breaks())
        outcome: list[object] = []

        def other() -> None:
            # 40 batches, with room for 2 in the queue: waits 20 s and raises TimeoutError if
            # the receiver kept reading into it.
            try:
                outcome.append(stream_partition(env, plan, 0, 0, rows(40_000)))
            except Exception as exc:
                outcome.append(exc)

        writer = threading.Thread(target=other)
        writer.start()
        poll("the queue full", lambda: rx._mode._queue.full(), deadline=30)
        tell_job_failed(plan, RuntimeError("the source broke"))
        writer.join(15)
        assert not writer.is_alive(), "the other partition's task still waits"
        assert not isinstance(outcome[0], TimeoutError), outcome
        with pytest.raises(RuntimeError, match="turned away.*the Spark job failed"):
            stream_partition(env, plan, 1, 1, rows(1000))
        with pytest.raises(cf.ProducerFailedError, match="the source broke"):
            list(rx)  # p1's and p0's batches first


def test_a_consumer_that_closes_at_the_stream_s_end_leaves_send_its_answer() -> None:
    """The stream ends on the driver's word that the job succeeded, and a consumer may close
    its receiver the moment it sees the end: the driver must have its answer by then (else
    ``send`` would raise that the receiver went away). The consumer starts late, so that
    the task is done (its channel read to the end) while its last batches wait in the
    receiver, and the driver's word comes before the partition ended there."""
    import pyarrow as pa

    import creditflow as cf
    import creditflow.spark as cfs
    from creditflow.spark._sending import register_job, stream_partition, tell_job_done

    for job in range(5):
        with cfs.Receiver(timeout=60, max_queued=1) as rx, cf.NetworkEnvironment(secret=rx.secret) as env:
            got: list[int] = []

            def consume(rx: cfs.Receiver = rx, got: list[int] = got) -> None:
                time.sleep(0.3)
                got.extend(b.num_rows for b in rx)
                rx.close()

            consumer = threading.Thread(target=consume)
            consumer.start()
            plan = register_job(plan_to(rx.address, f"j{job}", rx.secret), 1)
            batches = [pa.record_batch({"x": pa.array(range(100))})] * 3
            stats = stream_partition(env, plan, 0, 0, iter(batches))
            tell_job_done(plan, [stats])
            consumer.join(30)
        assert got == [100] * 3


def test_a_receiver_that_closed_before_reading_a_partition_is_named_by_its_task(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A spilling receiver closed just after it accepted a partition (its reader thread had not
    reached the task yet): the task learns it when it asks whether its partition was kept,
    and fails naming the receiver, not with a bare ``ConnectionRefusedError``."""
    import pyarrow as pa

    import creditflow as cf
    import creditflow.spark as cfs
    from creditflow.spark import _intake
    from creditflow.spark._sending import register_job, stream_partition

    read = _intake.Intake._read

    def late(self: Any, index: int, attempt: int, spec: Any) -> None:
        self.closed.wait()  # the reader starts only once the receiver is closing
        read(self, index, attempt, spec)

    monkeypatch.setattr(_intake.Intake, "_read", late)
    rx = cfs.Receiver(timeout=60, spill=True)
    try:
        with cf.NetworkEnvironment(secret=rx.secret) as env:
            plan = register_job(plan_to(rx.address, "j1", rx.secret), 1)
            address = rx.address

            def batches() -> Any:
                yield pa.record_batch({"x": pa.array(range(1000))})
                rx.close()

            with pytest.raises(ConnectionError, match=f"the receiver at {address} went away"):
                stream_partition(env, plan, 0, 0, batches())
    finally:
        rx.close()


@pytest.mark.parametrize("rows", [1000, 2_000_000], ids=["waits-for-readers", "waits-for-a-buffer"])
def test_a_receiver_gone_before_its_reader_connected_fails_the_task_soon(
    monkeypatch: pytest.MonkeyPatch, rows: int
) -> None:
    """A receiver that accepted a partition and went away before its reader reached the task
    leaves no connection to break: the task, blocked waiting for its readers (a small
    partition) or for a buffer (a large one), must not wait until its timeout but raise
    ``ConnectionError`` naming the receiver, once it finds the receiver gone."""
    import dataclasses

    import pyarrow as pa

    import creditflow as cf
    import creditflow.spark as cfs
    from creditflow.spark import _intake
    from creditflow.spark._sending import register_job, stream_partition

    def never(self: Any, index: int, attempt: int, spec: Any) -> None:
        self.closed.wait()  # the reader never reaches the task

    monkeypatch.setattr(_intake.Intake, "_read", never)
    rx = cfs.Receiver(timeout=60)
    address = rx.address
    try:
        with cf.NetworkEnvironment(secret=rx.secret, memory="4MiB") as env:
            # The old behaviour: TimeoutError after this long.
            plan = dataclasses.replace(register_job(plan_to(address, "j1", rx.secret), 1), timeout=30)

            def batches() -> Any:
                for start in range(0, rows, 10_000):
                    yield pa.record_batch({"x": pa.array(range(start, start + min(rows, 10_000)))})

            threading.Timer(0.5, rx.close).start()
            gone = f"partition 0: the receiver at {address} went away before"
            with pytest.raises(ConnectionError, match=gone):
                stream_partition(env, plan, 0, 0, batches())
    finally:
        rx.close()


def _watch_until_gone(address: str, secret: str, patience: float, limit: float) -> tuple[Any, float]:
    """A reader watch over a one-subpartition partition for the receiver at ``address``:
    what it found (``gone`` or None) within ``limit`` seconds, and when."""
    import creditflow as cf
    from creditflow.spark._watch import ReaderWatch

    with cf.NetworkEnvironment(secret="k" * 32, memory="1MiB") as env:
        part = env.create_partition("watched", 1)
        start = time.monotonic()
        who = lambda r: f"the receiver at {address}"  # noqa: E731
        watch = ReaderWatch(part, (address,), secret, who, patience, every=0.1)
        try:
            with watch:
                while watch.gone is None and time.monotonic() - start < limit:
                    time.sleep(0.05)
        except ConnectionError:
            pass
        return watch.gone, time.monotonic() - start


def test_a_receiver_that_stops_answering_is_gone_after_peer_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """A receiver on a vanished host or behind a cut link neither refuses nor drops the
    watch's asks: they time out. Taken for busy, it held the task until its own ``timeout``
    (600 s by default); now, silent for ``peer_timeout``, it is gone, as a data connection's
    peer would be."""
    from creditflow.spark import _messages

    monkeypatch.setattr(_messages, "HANDSHAKE_TIMEOUT", 0.3)
    with socket.create_server(("127.0.0.1", 0)) as mute:  # accepts, never speaks: every ask times out
        address = f"127.0.0.1:{mute.getsockname()[1]}"
        gone, after = _watch_until_gone(address, "k" * 32, patience=1.5, limit=15)
    assert gone is not None, "a receiver that never answers was taken for busy"
    assert "has not answered for" in gone, gone
    assert "peer_timeout=1.5 s" in gone, gone
    assert after >= 1.5, after  # silent for the whole patience first, not gone at the first timeout


def test_a_receiver_that_answers_keeps_its_task_past_peer_timeout() -> None:
    """The watch's asks are answered by a running receiver: however long its reader takes,
    the task goes on."""
    inbox = Inbox(lambda m: None, host="127.0.0.1", key="k" * 32, name="test-receiver")
    try:
        gone, after = _watch_until_gone(inbox.address, "k" * 32, patience=0.5, limit=3)
    finally:
        inbox.close()
    assert gone is None, gone
    assert after >= 3
