"""The reader threads of a receiver: a close that races a task's registration waits for
every thread that started and lets none start after it."""

from __future__ import annotations

import threading

from creditflow.spark._threads import Threads


def close_while_registering() -> tuple[list[int], list[int], list[int], bool]:
    """Two registering threads start readers as fast as they can while the receiver joins
    its threads; returns the readers that had run when join returned, the starts allowed,
    the readers that ran in the end and whether a start was refused."""
    threads = Threads()
    ran: list[int] = []
    allowed: list[int] = []
    refused = threading.Event()

    def register(base: int) -> None:
        for i in range(base, base + 10_000):
            if not threads.start(ran.append, f"reader-{i}", i):
                refused.set()
                return
            allowed.append(i)

    registrars = [threading.Thread(target=register, args=(b,)) for b in (0, 100_000)]
    for r in registrars:
        r.start()
    threads.join(timeout=10)
    done = sorted(ran)
    for r in registrars:
        r.join()
    return done, sorted(allowed), sorted(ran), refused.is_set()


def test_a_join_racing_starts_waits_for_each_started_thread_and_none_starts_after() -> None:
    """Join never meets a listed thread that is not started (Python raises "cannot join
    thread before it is started"), every start it allowed ran its reader before join
    returned, and every start after it was refused without running anything."""
    for _ in range(200):
        done, allowed, ran, refused = close_while_registering()
        assert refused, "a start after join began is refused"
        assert done == allowed == ran, "join waited for every allowed reader; no other ran"


def test_a_closed_set_of_threads_starts_nothing() -> None:
    threads = Threads()
    threads.join()
    ran = threading.Event()
    assert not threads.start(ran.set, "late")
    assert not ran.is_set()
