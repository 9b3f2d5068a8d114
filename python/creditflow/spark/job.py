"""``TrainingJob``: how ranks started by someone else (``torchrun``, PySpark's
``TorchDistributor``) find the driver that streams to them, and the driver finds them.

The driver opens a :class:`TrainingJob` before it starts the ranks and hands them its
:attr:`~TrainingJob.spec` (a short JSON string: the driver's address and the job's secret),
through the ``CREDITFLOW_JOB`` environment variable (:attr:`~TrainingJob.env`), a file
(:meth:`~TrainingJob.write`), or an argument of the training function. Each rank's
``Receiver(rank=..., world_size=..., batch_size=..., job=spec)`` takes the secret and tells
the driver its address; :meth:`TrainingJob.addresses` waits for all of them, in rank order,
for :func:`creditflow.spark.send`.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from creditflow._closeable import Closeable
from creditflow.spark import _messages

#: The environment variable a rank reads the job's spec from.
ENV_VAR = "CREDITFLOW_JOB"


class TrainingJob(Closeable):
    """The driver's side: listens on ``host`` (default ``SPARK_LOCAL_IP`` or loopback) for
    the ``world_size`` ranks' addresses."""

    def __init__(self, world_size: int, *, host: str | None = None) -> None:
        if world_size < 1:
            raise ValueError(f"world_size must be at least 1, got {world_size}")
        self.world_size = world_size
        #: The job's secret: the ranks' receivers and :func:`send` share it.
        self.secret = secrets.token_hex(32)
        self._cond = threading.Condition()
        self._ranks: dict[int, str] = {}
        self._errors: list[str] = []
        host = host or os.environ.get("SPARK_LOCAL_IP") or "127.0.0.1"
        self._inbox = _messages.Inbox(self._on_message, host=host, key=self.secret, name="creditflow-job")

    @property
    def spec(self) -> str:
        """What a rank needs to join: ``Receiver(..., job=spec)``."""
        return json.dumps({"address": self._inbox.address, "secret": self.secret})

    @property
    def env(self) -> dict[str, str]:
        """``{"CREDITFLOW_JOB": spec}``: add it to the ranks' environment."""
        return {ENV_VAR: self.spec}

    def write(self, path: str | os.PathLike[str]) -> Path:
        """Writes :attr:`spec` to ``path`` (readable by its owner only: it holds the secret)."""
        out = Path(path)
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.spec)
        return out

    def _on_message(self, msg: _messages.Message) -> _messages.Message | None:
        if msg.get("kind") != "rank_address":
            return {"ok": False, "reason": "unknown message"}
        rank, world = int(msg["rank"]), int(msg["world_size"])
        with self._cond:
            if world != self.world_size:
                self._errors.append(f"rank {rank} says world_size={world}, the job has {self.world_size}")
            elif not 0 <= rank < world:
                self._errors.append(f"rank {rank} is not in 0..{world - 1}")
            elif rank in self._ranks and self._ranks[rank] != msg["address"]:
                self._errors.append(f"rank {rank} joined twice ({self._ranks[rank]}, {msg['address']})")
            else:
                self._ranks[rank] = str(msg["address"])
            self._cond.notify_all()
            error = self._errors[-1] if self._errors else None
        return {"ok": error is None, "reason": error}

    def addresses(self, timeout: float | None = 300.0) -> list[str]:
        """Every rank's address, in rank order, once all joined. Raises TimeoutError naming
        the ranks missing after ``timeout`` seconds, ValueError for a rank that joined with
        other settings."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while len(self._ranks) < self.world_size and not self._errors:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    missing = sorted(set(range(self.world_size)) - set(self._ranks))
                    raise TimeoutError(
                        f"ranks {missing} of {self.world_size} did not join within {timeout} s"
                    )
                self._cond.wait(left)
            if self._errors:
                raise ValueError(f"a rank joined with other settings: {self._errors[0]}")
            return [self._ranks[r] for r in range(self.world_size)]

    def close(self) -> None:
        """Stops listening. Idempotent."""
        self._inbox.close()


@dataclass(frozen=True)
class FoundJob:
    """A rank's view of the job it joins."""

    address: str
    secret: str

    def register(self, rank: int, world_size: int, address: str) -> None:
        """Tells the driver this rank's receiver address; raises ValueError if refused."""
        answer = _messages.send(
            self.address,
            self.secret,
            {"kind": "rank_address", "rank": rank, "world_size": world_size, "address": address},
            reply=True,
        )
        if not answer.get("ok"):
            raise ValueError(
                f"the training job at {self.address} refused rank {rank}: {answer.get('reason')}"
            )


def find_job(job: str | None) -> FoundJob | None:
    """The job a rank joins: ``job`` is a spec or a file holding one; None: the
    ``CREDITFLOW_JOB`` environment variable (None when it is not set either)."""
    text = job if job is not None else os.environ.get(ENV_VAR)
    if text is None:
        return None
    if not text.lstrip().startswith("{"):
        try:
            text = Path(text).read_text()
        except OSError as exc:
            raise ValueError(f"job must be a TrainingJob spec or a file holding one: {exc}") from None
    try:
        d = json.loads(text)
        return FoundJob(str(d["address"]), str(d["secret"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"not a TrainingJob spec: {exc}") from None
