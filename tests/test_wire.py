"""The delay line and loss of the userspace wire (``tests/wire.py``), on an explicit clock: no
devices, no root. ``tests/test_netns.py`` runs it for real between two namespaces."""

from __future__ import annotations

import json
import math

import pytest

from wire import Link, _command, check_impairment


def test_a_packet_is_held_exactly_the_delay() -> None:
    link = Link(delay=0.020)
    link.push(b"p", now=10.0)
    assert link.next_due() == pytest.approx(10.020)
    assert link.due(10.0199) == []
    assert link.due(10.020) == [b"p"]
    assert link.due(99.0) == []
    assert link.stats()["queued"] == 0


def test_packets_leave_in_arrival_order_even_when_the_delay_shrinks() -> None:
    link = Link(delay=0.050)
    link.push(b"1", now=0.0)
    link.push(b"2", now=0.001)
    link.configure(delay=0.0, loss=0.0)
    link.push(b"3", now=0.002)  # due at once, but must not overtake 1 and 2
    assert link.due(0.010) == []
    assert link.due(0.052) == [b"1", b"2", b"3"]


def test_without_delay_a_packet_is_due_at_once() -> None:
    link = Link()
    link.push(b"x", now=5.0)
    assert link.due(5.0) == [b"x"]


@pytest.mark.parametrize("loss", [0.0, 0.01, 0.2, 1.0])
def test_loss_drops_that_fraction(loss: float) -> None:
    n = 100_000
    link = Link(loss=loss, seed=7, limit=n)
    for i in range(n):
        link.push(b"%d" % i, now=0.0)
    kept = link.due(0.0)
    s = link.stats()
    assert s["received"] == n
    assert s["dropped"] + len(kept) == n
    assert s["queued"] == 0
    # Binomial: within 5 standard deviations (a seeded generator, so always the same count).
    assert abs(s["dropped"] - n * loss) <= 5 * math.sqrt(n * loss * (1 - loss)) + 1e-9
    # What survives is in order, nothing duplicated.
    seqs = [int(p) for p in kept]
    assert seqs == sorted(set(seqs))


def test_the_same_seed_drops_the_same_packets() -> None:
    def survivors(seed: int) -> list[bytes]:
        link = Link(loss=0.1, seed=seed)
        for i in range(1000):
            link.push(b"%d" % i, now=0.0)
        return link.due(0.0)

    assert survivors(3) == survivors(3)
    assert survivors(3) != survivors(4)


def test_a_full_queue_drops_and_counts_overflow() -> None:
    link = Link(delay=1.0, limit=3)
    for i in range(5):
        link.push(b"%d" % i, now=0.0)
    assert link.stats()["overflow"] == 2
    assert link.due(1.0) == [b"0", b"1", b"2"]


@pytest.mark.parametrize(
    ("delay", "loss", "message"),
    [
        (-0.001, 0.0, "delay must be >= 0"),
        (math.nan, 0.0, "delay must be >= 0"),
        (0.0, -0.1, "loss must be a probability"),
        (0.0, 1.5, "loss must be a probability"),
        (0.0, math.nan, "loss must be a probability"),
    ],
)
def test_bad_impairments_are_refused(delay: float, loss: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_impairment(delay, loss)
    link = Link(delay=0.5, loss=0.5)
    with pytest.raises(ValueError, match=message):
        link.configure(delay=delay, loss=loss)
    assert (link.delay, link.loss) == (0.5, 0.5)  # unchanged


def test_relay_commands_set_both_directions_and_refuse_bad_ones(capsys: pytest.CaptureFixture[str]) -> None:
    links = {"a>b": Link(), "b>a": Link()}
    _command({"cmd": "set", "delay": 0.02, "loss": 0.01}, links)
    assert json.loads(capsys.readouterr().out) == {"set": {"delay": 0.02, "loss": 0.01}}
    assert all((link.delay, link.loss) == (0.02, 0.01) for link in links.values())
    for bad in ({"cmd": "set", "delay": 0.0, "loss": 2}, {"cmd": "set"}, {"cmd": "fly"}):
        _command(bad, links)
        assert "error" in json.loads(capsys.readouterr().out)
        assert all((link.delay, link.loss) == (0.02, 0.01) for link in links.values())
    _command({"cmd": "stats"}, links)
    stats = json.loads(capsys.readouterr().out)["stats"]
    assert set(stats) == {"a>b", "b>a"}
    assert stats["a>b"]["loss"] == 0.01
