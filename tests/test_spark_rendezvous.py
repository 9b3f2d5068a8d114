"""The driver's rendezvous for an exchange's tasks (no Spark needed): every task gets every
entry in task order, a group that does not fill up times out, a retried stage's tasks start
the group afresh, and a peer without the key is refused."""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("pyspark")
from creditflow.spark._rendezvous import Rendezvous, gather

#: Each stage's current attempt, as the driver's status tracker would say.
ATTEMPTS: dict[int, int] = {}


@pytest.fixture
def rdv() -> Iterator[Rendezvous]:
    ATTEMPTS.clear()
    with Rendezvous("127.0.0.1", lambda stage: ATTEMPTS.get(stage, 0)) as r:
        yield r


def meet(
    r: Rendezvous,
    group: str,
    tasks: int,
    who: list[tuple[int, int]],
    timeout: float | None = 30.0,
    stage: int = 1,
) -> dict[tuple[int, int], Any]:
    """Tasks (index, attempt) of ``group`` meet at once, each on a thread; what each got back
    (the entries, or the exception)."""
    out: dict[tuple[int, int], Any] = {}

    def one(task: int, attempt: int) -> None:
        try:
            out[(task, attempt)] = gather(
                r.address,
                r.key,
                group=group,
                stage=stage,
                tasks=tasks,
                task=task,
                attempt=attempt,
                entry={"task": task, "attempt": attempt},
                timeout=timeout,
            )
        except Exception as exc:
            out[(task, attempt)] = exc

    threads = [threading.Thread(target=one, args=w) for w in who]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def test_every_task_gets_every_entry_in_task_order(rdv: Rendezvous) -> None:
    got = meet(rdv, "x", 8, [(i, 100 + i) for i in reversed(range(8))])
    want = [{"task": i, "attempt": 100 + i} for i in range(8)]
    assert got == {(i, 100 + i): want for i in range(8)}
    assert rdv._groups == {}  # answered groups are dropped


def test_groups_are_apart(rdv: Rendezvous) -> None:
    a = threading.Thread(target=lambda: got.update(a=meet(rdv, "a", 2, [(0, 1), (1, 2)])))
    got: dict[str, Any] = {}
    a.start()
    got["b"] = meet(rdv, "b", 1, [(0, 3)])
    a.join(60)
    assert got["b"] == {(0, 3): [{"task": 0, "attempt": 3}]}
    assert got["a"][(0, 1)] == got["a"][(1, 2)] == [{"task": 0, "attempt": 1}, {"task": 1, "attempt": 2}]


def test_a_group_that_does_not_fill_up_times_out(rdv: Rendezvous) -> None:
    got = meet(rdv, "t", 3, [(0, 1), (1, 2)], timeout=0.5)
    for exc in got.values():
        assert isinstance(exc, TimeoutError)
        assert "only 2 of 3 tasks arrived within 0.5 s" in str(exc)
    assert rdv._groups == {}


def wait_for_group(r: Rendezvous, prefix: str) -> None:
    while not any(name.startswith(prefix) for name in r._groups):
        threading.Event().wait(0.01)


def test_a_retried_stage_meets_apart_from_its_failed_attempt(rdv: Rendezvous) -> None:
    first: dict[tuple[int, int], Any] = {}
    waiting = threading.Thread(target=lambda: first.update(meet(rdv, "r", 2, [(0, 1)])))
    waiting.start()
    wait_for_group(rdv, "r/1/0")
    # Task 1 of the first attempt never came; the stage runs again, task 1 first this time.
    ATTEMPTS[1] = 1
    second = meet(rdv, "r", 2, [(1, 6), (0, 5)])
    waiting.join(60)
    assert isinstance(first[(0, 1)], RuntimeError)
    assert "started again" in str(first[(0, 1)])
    want = [{"task": 0, "attempt": 5}, {"task": 1, "attempt": 6}]
    assert second == {(0, 5): want, (1, 6): want}
    assert rdv._groups == {}


def test_of_two_task_attempts_of_one_index_the_newer_wins(rdv: Rendezvous) -> None:
    got: dict[tuple[int, int], Any] = {}
    waiting = threading.Thread(target=lambda: got.update(meet(rdv, "n", 2, [(0, 3)])))
    waiting.start()
    wait_for_group(rdv, "n/")
    newer = threading.Thread(target=lambda: got.update(meet(rdv, "n", 2, [(0, 9)])))
    newer.start()
    waiting.join(60)
    assert isinstance(got[(0, 3)], RuntimeError)
    assert "newer task attempt" in str(got[(0, 3)])
    # A straggler older than the group's entry is refused, the group untouched.
    late = meet(rdv, "n", 2, [(0, 2)])
    assert isinstance(late[(0, 2)], RuntimeError)
    assert "older" in str(late[(0, 2)])
    done = meet(rdv, "n", 2, [(1, 10)])
    newer.join(60)
    assert done[(1, 10)] == got[(0, 9)] == [{"task": 0, "attempt": 9}, {"task": 1, "attempt": 10}]


def test_a_peer_without_the_key_is_refused(rdv: Rendezvous) -> None:
    with pytest.raises(multiprocessing.AuthenticationError):
        gather(
            rdv.address, "not-the-key", group="k", stage=1, tasks=1, task=0, attempt=0, entry={}, timeout=5
        )
    assert rdv._groups == {}


def test_bad_messages_get_an_error_not_a_hang(rdv: Rendezvous) -> None:
    with pytest.raises(RuntimeError, match="task 3 of a group of 2"):
        gather(rdv.address, rdv.key, group="m", stage=1, tasks=2, task=3, attempt=0, entry={}, timeout=5)
