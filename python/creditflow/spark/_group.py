"""The ranks of one job talking among themselves: every rank tells every other how many rows
it holds while the stream runs (so each knows how many batches it may yield before the end:
:func:`creditflow.spark._steps.full_steps_at_least`) and what it holds at the end; a rank whose
connection ends without saying goodbye has gone away, and the others fail instead of waiting.

Control messages only (:mod:`creditflow.spark._messages`); the rows themselves move over
creditflow channels.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from creditflow.spark import _messages

#: Seconds a rank that could not reach another waits for that rank's goodbye before it takes
#: it for gone. A closing rank says goodbye before it stops receiving, so a message sent to it
#: just then fails while its goodbye is on the way (or not yet handled here).
BYE_GRACE = 2.0


class Group:
    """Rank ``rank``'s view of the ``world`` ranks; ``changed`` is notified on every news."""

    def __init__(self, rank: int, world: int, secret: str, changed: threading.Condition) -> None:
        self.rank = rank
        self.world = world
        self._secret = secret
        self.changed = changed
        #: Rows each rank holds so far (its own included), and each rank's end (once known).
        self.rows = [0] * world
        self.ends: dict[int, dict[str, Any]] = {}
        #: The ranks that have every row this rank gave them at epoch 0's end.
        self.taken: set[int] = set()
        self.failure: str | None = None
        self._peers: list[str] = []
        self._outboxes: dict[int, _messages.Outbox] = {}
        self._bye: set[int] = set()
        #: Ranks a message could not reach (gone unless their goodbye comes within BYE_GRACE).
        self._unreachable: set[int] = set()
        self._send_lock = threading.Lock()
        self._closed = False
        self.on_failure: Callable[[str], None] | None = None

    def join(self, peers: list[str]) -> None:
        """The ranks' addresses, by rank (from the job's registration)."""
        with self._send_lock:
            self._peers = list(peers)

    def _fail(self, message: str) -> None:
        """The group failed: the first failure is the one the rank reports (a rank that
        failed says why before its connections close)."""
        with self.changed:
            if self.failure is None and not self._closed:
                self.failure = message
            first = self.failure or message
            self.changed.notify_all()
        if self.on_failure is not None:
            self.on_failure(first)

    def tell(self, message: dict[str, Any], to: int | None = None) -> None:
        """Sends ``message`` (with this rank's number) to rank ``to``, or to every other rank;
        one that cannot be reached has gone away unless its goodbye follows within
        :data:`BYE_GRACE` (it was closing): the group fails naming it."""
        message = {**message, "rank": self.rank}
        with self._send_lock:
            peers = list(enumerate(self._peers))
            for peer, address in peers:
                skip = peer in self._bye or peer in self._unreachable
                if peer == self.rank or skip or to not in (None, peer):
                    continue
                try:
                    box = self._outboxes.get(peer)
                    if box is None:
                        box = self._outboxes[peer] = _messages.Outbox(address, self._secret)
                        box.send({"kind": "rank_hello", "rank": self.rank})
                    box.send(message)
                except (OSError, EOFError) as exc:
                    self._outboxes.pop(peer, None)
                    self._unreachable.add(peer)
                    failure = f"rank {peer} at {address} went away ({type(exc).__name__}: {exc})"
                    threading.Thread(target=self._gone_unless_bye, args=(peer, failure), daemon=True).start()

    def _gone_unless_bye(self, peer: int, failure: str) -> None:
        """Fails the group with ``failure`` unless ``peer`` says goodbye (or that it failed,
        which fails the group with its own reason) within :data:`BYE_GRACE` seconds."""
        with self.changed:
            said = self.changed.wait_for(lambda: peer in self._bye or self._closed, timeout=BYE_GRACE)
        if not said:
            self._fail(failure)

    def handle(self, message: dict[str, Any]) -> None:
        """A message from another rank."""
        kind, peer = message.get("kind"), int(message.get("rank", -1))
        if not 0 <= peer < self.world:
            return
        failure: str | None = None
        with self.changed:
            if kind == "rank_rows":
                self.rows[peer] = max(self.rows[peer], int(message["rows"]))
            elif kind == "rank_end":
                self.rows[peer] = int(message["rows"])
                self.ends[peer] = message
            elif kind == "rank_taken":
                self.taken.add(peer)
            elif kind == "rank_bye":
                self._bye.add(peer)
                if peer not in self.ends:  # what it received of epoch 0 is gone with it
                    failure = f"rank {peer} closed before it had its share of epoch 0"
            elif kind == "rank_failed":
                self._bye.add(peer)  # its connection closes next: that is not news
                failure = f"rank {peer} failed: {message.get('error')}"
            self.changed.notify_all()
        if failure is not None:
            self._fail(failure)

    def lost(self, first: dict[str, Any]) -> None:
        """A connection from another rank ended: unless it said goodbye, it went away."""
        if first.get("kind") != "rank_hello":
            return
        peer = int(first.get("rank", -1))
        with self.changed:
            gone = peer not in self._bye and not self._closed
        if gone:
            address = self._peers[peer] if 0 <= peer < len(self._peers) else "?"
            self._fail(f"rank {peer} at {address} went away (its connection closed)")

    @property
    def gone(self) -> set[int]:
        """The ranks that said goodbye, failed or could not be reached (read with ``changed``
        held)."""
        return self._bye | self._unreachable

    def count(self, rows: int) -> None:
        """This rank's own rows so far."""
        with self.changed:
            self.rows[self.rank] = rows
            self.changed.notify_all()

    def close(self, failure: str | None = None) -> None:
        """Says goodbye (or that this rank failed) to the others and closes the links."""
        with self.changed:
            self._closed = True
            self.changed.notify_all()
        if failure is None:
            self.tell({"kind": "rank_bye"})
        else:
            self.tell({"kind": "rank_failed", "error": failure})
        with self._send_lock:
            boxes, self._outboxes = list(self._outboxes.values()), {}
        for box in boxes:
            box.close()
