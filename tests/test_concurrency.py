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
        assert m["out_pool"]["in_use"] > 0
        rows = sum(b.num_rows for b in gate)
        t.join(10)
        assert errors == []
        assert rows == 4 * 20_000
