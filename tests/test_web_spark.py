"""The pipeline page of Spark jobs: graphs built from the samples an exchange's, a send's and a
send-to-ranks' tasks (and ranks) report to their :class:`~creditflow.spark.Monitor`, the
bottleneck each names, and the Monitor's own page serving them (``Monitor(web=...)``)."""

from __future__ import annotations

import time
import urllib.error
from collections.abc import Sequence
from typing import Any

import pytest

from creditflow.samples import TaskSample
from creditflow.spark.monitor import Monitor, MonitorHandle, Reporter
from creditflow.tools.pipeline import from_spark
from creditflow.tools.snapshot import level_of
from helpers import by_id, get, get_json, poll

MB = 1_000_000


def exchange_sample(task: int, t: float, received: Sequence[float], bp: float, idle: float) -> TaskSample:
    """A sample an exchange task sends its Monitor: ``received`` bytes so far per producer."""
    return TaskSample(
        job="j1",
        kind="exchange",
        task=task,
        partition_id=f"cf-exchange/j1/{task}",
        time=t,
        done=False,
        rows_written=int(1000 * t),
        bytes_written=int(2 * MB * t),
        rows_received=int(sum(received) / 100),
        bytes_received=int(sum(received)),
        out_pool_usage=0.9,
        in_pool_usage=0.4,
        backpressured_ms_per_second=1000 * bp,
        level=level_of(bp),
        idle_ms_per_second=1000 * idle,
        channel_bytes=[int(x) for x in received],
    )


def test_spark_exchange_tasks_are_nodes_and_the_all_to_all_their_edges() -> None:
    def samples(t: float) -> list[TaskSample]:
        return [
            exchange_sample(0, t, [MB * t, 2 * MB * t], bp=0.9, idle=0.85),
            exchange_sample(1, t, [3 * MB * t, MB * t], bp=0.9, idle=0.01),
        ]

    previous = {s.key: s for s in samples(10.0)}
    p = from_spark(samples(10.5), previous)
    assert [(n.id, n.name) for n in p.nodes] == [("j1/0", "task 0"), ("j1/1", "task 1")]
    edges = {(e.source, e.target): e.bytes_per_second for e in p.edges}
    assert edges == {("j1/1", "j1/0"): pytest.approx(2 * MB), ("j1/0", "j1/1"): pytest.approx(3 * MB)}
    assert sorted(e.partitions for e in p.edges) == [["cf-exchange/j1/0"], ["cf-exchange/j1/1"]]
    assert [n.id for n in p.bottlenecks] == ["j1/1"]
    assert by_id(p)["j1/0"].bytes_out_per_second == pytest.approx(2 * MB)
    assert by_id(p)["j1/0"].in_pool_usage == 0.4
    # Without a previous sample: the same graph, no rates yet.
    first = from_spark(samples(10.0))
    assert len(first.edges) == 2
    assert all(e.bytes_per_second == 0 for e in first.edges)


def test_spark_exchange_with_a_hot_key_names_the_task_that_receives_the_most() -> None:
    """Skew: every producer (the hot task 2 included, which writes to itself) is HIGH, and task 2
    receives three times what task 0 does, both busy; task 1 is idle. Task 2 is the bottleneck,
    not task 0, the busy reader whose upstream is HIGH that the general rule names."""

    def samples(t: float) -> list[TaskSample]:
        out = [
            exchange_sample(task, t, [share * MB * t] * 3, bp=0.9, idle=idle)
            for task, share, idle in ((0, 1, 0.2), (1, 1, 0.9), (2, 3, 0.0))
        ]
        out[0].level, out[0].backpressured_ms_per_second = "OK", 0.0
        return out

    p = from_spark(samples(10.5), {s.key: s for s in samples(10.0)})
    assert [n.id for n in p.bottlenecks] == ["j1/2"]
    assert "receiving the most (9.0 MB/s, 3.0x the median)" in by_id(p)["j1/2"].reason
    assert by_id(p)["j1/0"].reason == "waits for task 2, which receives the most"
    # Without rates (no previous sample) the general rule stands.
    assert [n.id for n in from_spark(samples(10.5)).bottlenecks] == ["j1/0"]


def test_spark_send_tasks_feed_one_receiver() -> None:
    def sample(task: int, t: float) -> TaskSample:
        return TaskSample(
            job="s9",
            kind="send",
            task=task,
            time=t,
            done=task == 2,
            receiver="10.1.1.1:5000",
            partition_id=f"cf-send/s9/{task}",
            rows_written=int(100 * t),
            bytes_written=int(MB * t),
            out_pool_usage=0.2,
        )

    p = from_spark([sample(i, 2.0) for i in range(3)], {sample(i, 1.0).key: sample(i, 1.0) for i in range(3)})
    assert [n.name for n in p.nodes] == ["task 0", "task 1", "task 2", "receiver"]
    assert "10.1.1.1:5000" in p.nodes[-1].reason
    assert {(e.source, e.target) for e in p.edges} == {(f"s9/{i}", "s9/receiver") for i in range(3)}
    assert all(e.bytes_per_second == pytest.approx(MB) for e in p.edges)
    assert by_id(p)["s9/2"].reason == "done"
    assert [n.layer for n in p.nodes] == [0, 0, 0, 1]


def send_to_ranks(
    t: float, task_bp: float, rank_stall: Sequence[float], rank_bp: float = 0.0
) -> list[TaskSample]:
    """Samples at time ``t`` of a send's two tasks (backpressured ``task_bp`` of each second)
    and of its ranks (each waiting for data ``rank_stall[r]`` of each second)."""
    tasks = [
        TaskSample(
            job="t1",
            kind="send",
            task=i,
            time=t,
            partition_id=f"cf-send/t1/{i}",
            rows_written=int(1000 * t),
            bytes_written=int(MB * t),
            backpressured_ms_per_second=1000 * task_bp,
            idle_ms_per_second=0.0,
            level=level_of(task_bp),
        )
        for i in range(2)
    ]
    ranks = [
        TaskSample(
            job="t1",
            kind="rank",
            task=r,
            time=t,
            rows_received=int(1000 * t),
            rows_written=int(900 * t),
            idle_ms_per_second=1000 * stall,
            backpressured_ms_per_second=1000 * rank_bp,
            level=level_of(rank_bp),
        )
        for r, stall in enumerate(rank_stall)
    ]
    return tasks + ranks


def test_a_send_to_ranks_names_spark_as_the_bottleneck_when_the_ranks_wait_for_data() -> None:
    """The ranks wait for data most of each second and the tasks are not held back: Spark
    is the bottleneck (its busiest task), said in words; every task feeds every rank."""
    p = from_spark(send_to_ranks(2.0, 0.02, [0.8, 0.9]))
    assert [n.name for n in p.nodes] == ["task 0", "task 1", "rank 0", "rank 1"]
    assert {(e.source, e.target) for e in p.edges} == {
        (f"t1/{i}", f"t1/rank{r}") for i in range(2) for r in range(2)
    }
    (neck,) = p.bottlenecks
    assert neck.id in ("t1/0", "t1/1")
    assert neck.reason.startswith("Spark: the ranks wait for data up to 90% of each second")
    assert p.to_json()["bottleneck"] == [{"id": neck.id, "name": neck.name, "reason": neck.reason}]


@pytest.mark.parametrize("as_seen_by", ["tasks", "ranks"])
def test_a_send_to_ranks_names_the_slowest_trainer_when_the_tasks_wait(as_seen_by: str) -> None:
    """The tasks are held back most of each second (their own backpressure, or the ranks'
    full queues say so): the trainer is the bottleneck, the rank that waits least for data."""
    task_bp, rank_bp = (0.8, 0.0) if as_seen_by == "tasks" else (0.0, 0.7)
    p = from_spark(send_to_ranks(2.0, task_bp, [0.3, 0.05], rank_bp))
    (neck,) = p.bottlenecks
    assert neck.id == "t1/rank1"
    assert neck.reason.startswith("the trainer: the tasks wait for rank 1")


def test_a_send_to_ranks_where_nobody_waits_has_no_bottleneck() -> None:
    assert from_spark(send_to_ranks(2.0, 0.05, [0.1, 0.2])).bottlenecks == []


def test_the_monitor_page_says_whether_spark_or_the_trainer_holds_a_send_back() -> None:
    """Two tasks and two ranks report through the real Reporter; the page's data names the
    trainer (the tasks are backpressured), then Spark (the ranks wait for data)."""
    with Monitor(interval=0.05, web=0) as mon:
        assert mon.web_url is not None
        handle = MonitorHandle(mon.handle.address, mon.handle.key, mon.handle.interval)
        state = {"task_bp": 0.9, "stall": [0.2, 0.1]}
        start = time.time()

        def reporter(i: int) -> Reporter:
            def sample() -> TaskSample:
                return send_to_ranks(time.time() - start, state["task_bp"], state["stall"])[i]  # type: ignore[arg-type]

            return Reporter(handle, sample)

        reporters = [reporter(i) for i in range(4)]
        try:

            def named(words: str) -> Any:
                data = get_json(mon.web_url + "api/pipeline")
                reasons = [b["reason"] for b in data["bottleneck"]]
                return data if len(data["nodes"]) == 4 and any(r.startswith(words) for r in reasons) else None

            trainer = poll("the trainer named", lambda: named("the trainer"), deadline=20)
            state.update(task_bp=0.0, stall=[0.9, 0.95])
            spark = poll("Spark named", lambda: named("Spark"), deadline=20)
        finally:
            for r in reporters:
                r.stop()
    assert [b["id"] for b in trainer["bottleneck"]] == ["t1/rank1"]
    assert spark["bottleneck"][0]["id"] in ("t1/0", "t1/1")


def test_monitor_web_serves_the_tasks_that_report_to_it() -> None:
    """Monitor(web=0) with two tasks reporting through the real Reporter (no Spark needed)."""
    with Monitor(interval=0.05, web=0) as mon:
        assert mon.web_url is not None
        assert mon.web_url.startswith("http://127.0.0.1:")
        handle = MonitorHandle(mon.handle.address, mon.handle.key, mon.handle.interval)
        start = time.time()

        def task(i: int) -> Reporter:
            def sample() -> TaskSample:
                t = time.time() - start
                return exchange_sample(i, t, [MB * t, MB * t], bp=0.0, idle=0.9)

            return Reporter(handle, sample)

        reporters = [task(0), task(1)]
        try:

            def both_with_rates() -> dict[str, Any] | None:
                data = get_json(mon.web_url + "api/pipeline")
                rates = [e["bytes_per_second"] for e in data["edges"]]
                return data if len(data["nodes"]) == 2 and len(rates) == 2 and min(rates) > 0 else None

            data = poll("two tasks and two edges with throughput", both_with_rates, deadline=20)
        finally:
            for r in reporters:
                r.stop()
        assert {(e["source"], e["target"]) for e in data["edges"]} == {("j1/0", "j1/1"), ("j1/1", "j1/0")}
        assert data["levels"] == {"j1/0": "OK", "j1/1": "OK"}
        assert data["bottleneck"] == []
        assert b"<svg" in get(mon.web_url)[1]
        url = mon.web_url
    with pytest.raises(urllib.error.URLError, match="refused"):
        get(url)  # closed with the monitor
