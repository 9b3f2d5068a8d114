"""Who-is-where for an exchange's tasks, through the driver instead of Spark's barrier
``allGather``.

``BarrierTaskContext.allGather`` answers every task but the last to arrive up to a second
late: the executor checks its barrier request once a second. For an exchange that second is
pure wait, paid once per run whatever the data size. On a classic session the driver is
reachable from every executor (they register with it), so the driver process keeps one
:class:`Rendezvous`: each task sends its own entry and gets everyone's back as soon as the
last task's has arrived. Messages go through :mod:`creditflow.spark._messages` (an HMAC
challenge with a key that travels in the job's closure, JSON only).

A group is one run of one exchange: the exchange's id, Spark's stage id and that stage's
current attempt, which the driver's status tracker knows (a retried barrier stage runs every
task again, in a new attempt; the old attempt's group is failed, so none of its entries can
reach the new one). Should a task of an old attempt still arrive under the new one, the entry
with the newer Spark task attempt id for that index wins and the other task gets an error. A
group that does not fill up within the exchange's ``timeout`` answers its tasks with an
error and is dropped.
"""

from __future__ import annotations

import atexit
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from creditflow._closeable import Closeable
from creditflow.spark import _messages

#: Groups kept at most (each holds only its tasks' small entries while it fills).
MAX_GROUPS = 1024


@dataclass
class _Group:
    tasks: int
    #: Each task's Spark task attempt id and entry.
    entries: dict[int, tuple[int, Any]] = field(default_factory=dict)
    answered: int = 0
    failed: str | None = None


class Rendezvous(Closeable):
    """The driver's meeting point: groups of tasks that each send an entry and wait for all.

    ``stage_attempt`` gives a stage's current attempt (None: every stage has one attempt).
    """

    def __init__(self, host: str, stage_attempt: Callable[[int], int] | None = None) -> None:
        self.key = secrets.token_hex(32)
        self._stage_attempt = stage_attempt
        self._groups: dict[str, _Group] = {}
        self._cond = threading.Condition()
        self._inbox = _messages.Inbox(self._on_message, host=host, key=self.key, name="creditflow-rendezvous")
        self.address = self._inbox.address

    def _on_message(self, m: _messages.Message) -> _messages.Message:
        try:
            base, stage = str(m["group"]), int(m["stage"])
            tasks, task, attempt = int(m["tasks"]), int(m["task"]), int(m["attempt"])
            timeout = m.get("timeout")
            entry = m["entry"]
        except (KeyError, TypeError, ValueError) as exc:
            return {"error": f"bad rendezvous message: {exc!r}"}
        if not 0 <= task < tasks:
            return {"error": f"task {task} of a group of {tasks}"}
        deadline = None if timeout is None else time.monotonic() + float(timeout)
        generation = 0
        if self._stage_attempt is not None:
            try:
                generation = self._stage_attempt(stage)
            except Exception:  # a stopped context: one attempt is all it will see
                generation = 0
        name = f"{base}/{stage}/{generation}"
        with self._cond:
            self._fail_older(f"{base}/{stage}/", generation)
            group = self._groups.get(name)
            if group is None:
                if len(self._groups) >= MAX_GROUPS:
                    return {"error": f"more than {MAX_GROUPS} exchanges meeting at once"}
                group = self._groups[name] = _Group(tasks)
            if group.tasks != tasks:
                return {"error": f"{name} has {group.tasks} tasks, task {task} says {tasks}"}
            if attempt <= group.entries.get(task, (-1, None))[0]:
                return {"error": f"task {task} of {name}: attempt {attempt} is older than the group's"}
            group.entries[task] = (attempt, entry)
            self._cond.notify_all()
            while (
                len(group.entries) < group.tasks
                and group.failed is None
                and group.entries[task][0] == attempt
            ):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    group.failed = (
                        f"only {len(group.entries)} of {group.tasks} tasks arrived within {timeout} s"
                    )
                    break
                self._cond.wait(left)
            if group.entries[task][0] != attempt:
                return {"error": f"task {task} of {name} arrived again in a newer task attempt"}
            group.answered += 1
            done = group.failed is not None or group.answered == group.tasks
            if done and group.answered == len(group.entries) and self._groups.get(name) is group:
                del self._groups[name]
            if group.failed is not None:
                self._cond.notify_all()
                return {"error": group.failed}
            return {"entries": [group.entries[i][1] for i in range(group.tasks)]}

    def _fail_older(self, prefix: str, generation: int) -> None:
        """Fails the groups of earlier attempts of the stage ``prefix`` names (lock held)."""
        for name, group in self._groups.items():
            if name.startswith(prefix) and int(name[len(prefix) :]) < generation and group.failed is None:
                group.failed = f"{name}: the stage was started again (attempt {generation})"
                self._cond.notify_all()

    def close(self) -> None:
        """Stops serving (tasks still waiting get their connection closed)."""
        self._inbox.close()


_LOCK = threading.Lock()
_SHARED: dict[str, Rendezvous] = {}


def driver_rendezvous(host: str, stage_attempt: Callable[[int], int] | None) -> Rendezvous:
    """This driver process's rendezvous on ``host``, started on first use (never at import:
    Spark forks its Python workers from processes that import this module). ``stage_attempt``
    as for :class:`Rendezvous`: the latest call's (the driver's current SparkContext)."""
    with _LOCK:
        r = _SHARED.get(host)
        if r is None:
            r = _SHARED[host] = Rendezvous(host, stage_attempt)
            atexit.register(r.close)
        r._stage_attempt = stage_attempt
        return r


def gather(
    address: str,
    key: str,
    *,
    group: str,
    stage: int,
    tasks: int,
    task: int,
    attempt: int,
    entry: Any,
    timeout: float | None,
) -> list[Any]:
    """Sends ``entry`` as task ``task`` of ``group`` (``tasks`` in all) in Spark stage ``stage``
    (``attempt``: Spark's task attempt id) to the rendezvous at ``address`` and returns every
    task's entry, by task index, once all have arrived.

    Raises:
        TimeoutError: not every task arrived within ``timeout`` seconds.
        RuntimeError: the rendezvous refused the message.
        OSError: the driver cannot be reached.
    """
    answer = _messages.send(
        address,
        key,
        {
            "group": group,
            "stage": stage,
            "tasks": tasks,
            "task": task,
            "attempt": attempt,
            "entry": entry,
            "timeout": timeout,
        },
        reply=True,
        # The rendezvous answers at its own deadline; wait a little longer than it.
        timeout=365 * 86400.0 if timeout is None else timeout + 30.0,
    )
    if "error" in answer:
        err = str(answer["error"])
        raise (TimeoutError if "arrived within" in err else RuntimeError)(f"creditflow rendezvous: {err}")
    entries: list[Any] = answer["entries"]
    return entries
