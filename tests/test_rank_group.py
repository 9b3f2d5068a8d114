"""The control messages between training ranks (:class:`creditflow.spark._group.Group`) over
real inboxes: what a rank makes of another that cannot be reached, as it closes, fails or is
gone."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

pytest.importorskip("pyspark")
from creditflow.spark import _group
from creditflow.spark._group import Group
from creditflow.spark._messages import Inbox, Message

SECRET = "g" * 64


class Pair:
    """Ranks 0 and 1, each a group and an inbox that hands it the other's messages; rank 0
    handles a goodbye or failure ``late`` seconds after it arrives (a busy inbox thread)."""

    def __init__(self, late: float) -> None:
        self.groups = [Group(r, 2, SECRET, threading.Condition()) for r in range(2)]
        self.inboxes = [
            Inbox(
                self._handler(r, late if r == 0 else 0.0),
                host="127.0.0.1",
                key=SECRET,
                name=f"g{r}",
                on_end=self.groups[r].lost,
            )
            for r in range(2)
        ]
        for g in self.groups:
            g.join([box.address for box in self.inboxes])

    def _handler(self, r: int, late: float) -> Callable[[Message], None]:
        def handle(message: Message) -> None:
            if message.get("kind") in ("rank_bye", "rank_failed"):
                time.sleep(late)
            self.groups[r].handle(message)

        return handle

    def failure_of_0(self, within: float) -> str | None:
        """Rank 0's failure once there, or None after ``within`` seconds."""
        g = self.groups[0]
        with g.changed:
            g.changed.wait_for(lambda: g.failure is not None, timeout=within)
            return g.failure

    def close(self) -> None:
        for g in self.groups:
            g.close()
        for box in self.inboxes:
            box.close()


@pytest.fixture
def pair() -> Iterator[Pair]:
    p = Pair(late=0.5)
    yield p
    p.close()


def test_a_message_to_a_rank_that_just_closed_is_no_failure(pair: Pair) -> None:
    """Rank 1, done with epoch 0, says goodbye and stops receiving; rank 0 tells it
    something before it has handled the goodbye: the refused connection is not taken for rank
    1 going away."""
    g0 = pair.groups[0]
    pair.groups[1].tell({"kind": "rank_end", "rows": 5})
    with g0.changed:
        assert g0.changed.wait_for(lambda: 1 in g0.ends, timeout=10)
    pair.groups[1].close()
    pair.inboxes[1].close()
    pair.groups[0].tell({"kind": "rank_rows", "rows": 5})
    assert pair.failure_of_0(within=_group.BYE_GRACE + 1.0) is None
    with g0.changed:
        assert g0.gone == {1}


def test_a_rank_that_stops_receiving_without_goodbye_is_gone(pair: Pair) -> None:
    """Rank 1's inbox closes with no goodbye (as when it was killed before it had spoken to
    rank 0): rank 0's message is refused and, no goodbye following, rank 0 fails naming it."""
    pair.inboxes[1].close()
    start = time.monotonic()
    pair.groups[0].tell({"kind": "rank_rows", "rows": 5})
    failure = pair.failure_of_0(within=_group.BYE_GRACE + 10.0)
    assert failure is not None
    assert failure.startswith("rank 1 at "), failure
    assert "went away (ConnectionRefusedError" in failure, failure
    assert time.monotonic() - start >= _group.BYE_GRACE * 0.9


def test_a_rank_that_failed_is_reported_with_its_reason_not_as_gone(pair: Pair) -> None:
    """Rank 1 fails (and says why) and stops receiving; rank 0's message to it is refused
    before rank 0 has handled the word: rank 0's failure is rank 1's reason."""
    pair.groups[1].close(failure="OSError: no space left on device")
    pair.inboxes[1].close()
    pair.groups[0].tell({"kind": "rank_rows", "rows": 5})
    failure = pair.failure_of_0(within=_group.BYE_GRACE + 10.0)
    assert failure == "rank 1 failed: OSError: no space left on device"
