"""Calls from other threads while a reader or writer is blocked never wait for it."""

from __future__ import annotations

import threading
import time

import pyarrow as pa

import creditflow as cf


def test_gate_metrics_and_getters_answer_while_next_blocks() -> None:
    with cf.NetworkEnvironment(memory="1MiB") as env:
        part = env.create_partition("p", 1)
        gate = env.create_input_gate([cf.ChannelSpec(env.address, "p", 0)])
        started = threading.Event()
        result: list[object] = []

        def reader() -> None:
            started.set()
            result.append(gate.next(timeout=10))  # blocks: nothing written yet

        t = threading.Thread(target=reader)
        t.start()
        started.wait()
        time.sleep(0.2)  # the reader is now inside next(), holding the gate
        done = threading.Event()
        answers: list[object] = []

        def ask() -> None:
            answers.extend([gate.metrics()["num_channels"], gate.num_channels, len(gate.channels)])
            done.set()

        threading.Thread(target=ask, daemon=True).start()
        assert done.wait(5), "gate.metrics() waited for the blocked reader"
        assert answers == [1, 1, 1]
        with cf.RecordWriter(part) as w:
            w.write(pa.record_batch({"x": [1]}))
        t.join(10)
        assert isinstance(result[0], pa.RecordBatch)


def test_writer_metrics_answer_while_write_blocks() -> None:
    with cf.NetworkEnvironment(memory="256KiB", segment_size="32KiB") as env:
        part = env.create_partition("p", 1)
        gate = env.create_input_gate([cf.ChannelSpec(env.address, "p", 0)])
        w = cf.RecordWriter(part, timeout=10)
        big = pa.record_batch({"x": pa.array(range(20_000), pa.int64())})  # 160 KB: 5 segments
        errors: list[BaseException] = []

        def writer() -> None:
            try:
                for _ in range(4):  # the second write blocks until the reader drains
                    w.write(big)
                w.close()
            except BaseException as e:  # reported to the test thread
                errors.append(e)

        t = threading.Thread(target=writer)
        t.start()
        time.sleep(0.3)
        t0 = time.monotonic()
        m = w.metrics()
        assert time.monotonic() - t0 < 1.0
        assert m["pool"]["in_use"] > 0
        rows = sum(b.num_rows for b in gate)
        t.join(10)
        assert errors == []
        assert rows == 4 * 20_000


def _hammer(call: object, seconds: float) -> bool:
    """Calls `call()` in a tight loop on a daemon thread; True if it kept answering."""
    done = threading.Event()

    def loop() -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            call()  # type: ignore[operator]
        done.set()

    threading.Thread(target=loop, daemon=True).start()
    return done.wait(seconds + 10)


def test_partition_metrics_in_a_loop_while_a_writer_is_blocked() -> None:
    # A blocked writer wakes every 50 ms to check for Ctrl-C, which needs the GIL; it must not
    # hold the pool's lock then, or a thread asking for metrics (GIL held) deadlocks with it.
    with cf.NetworkEnvironment(memory="256KiB", segment_size="32KiB") as env:
        part = env.create_partition("p", 1)
        gate = env.create_input_gate([cf.ChannelSpec(env.address, "p", 0)])
        w = cf.RecordWriter(part)
        big = pa.record_batch({"x": pa.array(range(20_000), pa.int64())})
        t = threading.Thread(target=lambda: [w.write(big, timeout=20) for _ in range(3)])
        t.start()
        time.sleep(0.2)  # the writer is blocked on a full pool
        assert _hammer(part.metrics, 2.0), "metrics() deadlocked with the blocked writer"
        assert _hammer(env.metrics, 1.0), "env.metrics() deadlocked with the blocked writer"
        for _ in range(3):
            assert gate.next(timeout=10) is not None
        t.join(20)
        w.close()


def test_flush_in_a_loop_while_a_reader_is_blocked() -> None:
    # flush() runs with the GIL and wakes the reader through the gate's ready queue; the
    # reader must not hold that queue's lock while it takes the GIL for its Ctrl-C check.
    with cf.NetworkEnvironment(memory="1MiB", local_handoff=False) as env:
        part = env.create_partition("p", 1)
        gate = env.create_input_gate([cf.ChannelSpec(env.address, "p", 0)])
        w = cf.RecordWriter(part)
        got: list[object] = []
        t = threading.Thread(target=lambda: got.append(gate.next(timeout=20)))
        t.start()
        time.sleep(0.2)
        assert _hammer(w.flush, 2.0), "flush() deadlocked with the blocked reader"
        w.write(pa.record_batch({"x": [1, 2, 3]}))
        w.flush()
        t.join(20)
        assert isinstance(got[0], pa.RecordBatch)
        w.close()
