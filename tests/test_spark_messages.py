"""The control messages of creditflow.spark (``_messages``): many tasks connecting at once.

Every task of an exchange or a ``send`` with a monitor opens an ``Outbox`` to the driver's
``Inbox`` when it starts, so with many tasks they all connect within milliseconds.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

import pytest

pytest.importorskip("pyspark")
from creditflow.spark._messages import Inbox, Message, Outbox, request, send
from helpers import poll

PEERS = 64


@pytest.mark.parametrize("places", [None, 4], ids=["default", "fewer-places-than-peers"])
def test_many_peers_connecting_at_once_all_get_through(
    monkeypatch: pytest.MonkeyPatch, places: int | None
) -> None:
    """With the listen backlog multiprocessing uses by default (1), peers whose connection did
    not fit waited for the authentication challenge forever; every one must get through, also
    when they are more than the inbox's handshake places (none of their handshakes, each a
    round trip or two, is old enough to be cut short for a newer one)."""
    from creditflow.spark import _messages

    if places is not None:
        monkeypatch.setattr(_messages, "MAX_HANDSHAKES", places)
    got: list[Message] = []
    lock = threading.Lock()

    def handle(message: Message) -> None:
        with lock:
            got.append(message)

    inbox = Inbox(handle, host="127.0.0.1", key="k" * 32, name="test-inbox")
    start = threading.Barrier(PEERS)

    def peer(i: int) -> None:
        start.wait()
        out = Outbox(inbox.address, "k" * 32)
        out.send({"peer": i})
        out.close()

    threads = [threading.Thread(target=peer, args=(i,), daemon=True) for i in range(PEERS)]
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        stuck = sum(t.is_alive() for t in threads)
        assert stuck == 0, f"{stuck} of {PEERS} peers never got through"
        while time.monotonic() < deadline:
            with lock:
                if len(got) == PEERS:
                    break
            time.sleep(0.05)
        assert sorted(m["peer"] for m in got) == list(range(PEERS))
    finally:
        inbox.close()


def _nodelay(fd: int) -> bool:
    with socket.socket(fileno=os.dup(fd)) as s:
        return bool(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))


def test_both_ends_of_a_control_connection_send_at_once() -> None:
    """A message written right after the authentication handshake (whose last write is the
    client's) waited for that write's delayed ACK, 40 ms on Linux, with Nagle's algorithm on:
    every registration and confirmation of every task paid it. Both ends turn it off."""
    seen: list[bool] = []

    def handle(message: Message) -> Message:
        with inbox._lock:  # the connection this message came on: the only one open
            seen.extend(_nodelay(c.fileno()) for c in inbox._conns)
        return {"echo": message["n"]}

    inbox = Inbox(handle, host="127.0.0.1", key="k" * 32, name="test-inbox")
    try:
        assert send(inbox.address, "k" * 32, {"n": 7}, reply=True) == {"echo": 7}
        assert seen == [True]
        out = Outbox(inbox.address, "k" * 32)
        try:
            assert _nodelay(out._conn.fileno())
        finally:
            out.close()
    finally:
        inbox.close()


def test_requests_to_one_inbox_share_a_connection_and_survive_its_loss() -> None:
    """A task's registration and confirmation go over one kept connection; one the inbox
    closed meanwhile is replaced, the message handled once; an answer that came too late
    is not taken for the next request's."""
    seen: list[tuple[int, int]] = []
    slow = threading.Event()

    def handle(message: Message) -> Message:
        seen.append((message["n"], threading.get_ident()))  # one serving thread per connection
        if slow.is_set():
            time.sleep(0.5)
        return {"echo": message["n"]}

    inbox = Inbox(handle, host="127.0.0.1", key="k" * 32, name="test-inbox")
    try:
        assert [request(inbox.address, "k" * 32, {"n": n})["echo"] for n in range(3)] == [0, 1, 2]
        assert len({ident for _, ident in seen}) == 1
        with inbox._lock:
            conns = list(inbox._conns)
        for c in conns:  # as when the receiver's side drops it
            with socket.socket(fileno=os.dup(c.fileno())) as sock:
                sock.shutdown(socket.SHUT_RDWR)
        time.sleep(0.1)
        assert request(inbox.address, "k" * 32, {"n": 3}) == {"echo": 3}
        assert [n for n, _ in seen] == [0, 1, 2, 3]
        slow.set()
        with pytest.raises(TimeoutError):
            request(inbox.address, "k" * 32, {"n": 4}, timeout=0.1)
        slow.clear()
        time.sleep(0.6)  # the late answer to 4 arrives on a connection no longer used
        assert request(inbox.address, "k" * 32, {"n": 5}) == {"echo": 5}
    finally:
        inbox.close()


def _in_thread(fn: Any, limit: float) -> tuple[bool, Any]:
    """Runs ``fn`` on a thread for at most ``limit`` seconds: (done, its result or error)."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(limit)
    return (not t.is_alive(), out[0] if out else None)


def _echo_inbox(name: str) -> Inbox:
    """An inbox on loopback with key ``"k" * 32`` that answers ``{"n": x}`` with ``{"echo": x}``."""
    return Inbox(lambda m: {"echo": m["n"]}, host="127.0.0.1", key="k" * 32, name=name)


def _raw_peer(inbox: Inbox) -> socket.socket:
    """A plain TCP connection to ``inbox``, which speaks no handshake unless told to."""
    host, port = inbox.address.rsplit(":", 1)
    return socket.create_connection((host, int(port)))


def test_a_peer_that_connects_and_says_nothing_holds_up_no_one_else(monkeypatch: pytest.MonkeyPatch) -> None:
    """The handshake ran in the listener's accept(): one peer that connected and never
    answered the challenge (a port scanner, a stopped process) held up every other peer's
    messages for as long as it stayed. Each connection has its own handshake now, with a
    deadline after which the silent one is dropped; a wrong key is still refused."""
    import multiprocessing

    from creditflow.spark import _messages

    monkeypatch.setattr(_messages, "HANDSHAKE_TIMEOUT", 1.0)
    inbox = _echo_inbox("test-inbox")
    try:
        with _raw_peer(inbox) as silent:
            silent.settimeout(10)
            done, answer = _in_thread(lambda: request(inbox.address, "k" * 32, {"n": 1}, timeout=5), 10)
            assert done, "a silent peer held up the inbox"
            assert answer == {"echo": 1}
            # The inbox sent its challenge, then dropped the silent peer at the deadline.
            received = b""
            while chunk := silent.recv(4096):
                received += chunk
            assert received, "no challenge was sent"
        with pytest.raises(multiprocessing.AuthenticationError):
            request(inbox.address, "wrong" * 8, {"n": 2})
        assert request(inbox.address, "k" * 32, {"n": 3}) == {"echo": 3}
    finally:
        inbox.close()


def test_a_peer_that_trickles_its_handshake_is_cut_off_at_the_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The handshake's limit held per read: a peer that sent its answer a byte at a time,
    each within the limit, kept its handshake (and, with the inbox's handshakes capped, a
    slot every other peer waits for) for as long as it liked. The deadline is for the whole
    handshake now: the trickling peer is cut off once it passed, and the inbox serves on."""
    from creditflow.spark import _messages

    monkeypatch.setattr(_messages, "HANDSHAKE_TIMEOUT", 1.0)
    inbox = _echo_inbox("trickled-inbox")
    try:
        with _raw_peer(inbox) as peer:
            peer.settimeout(5)
            assert peer.recv(4096), "no challenge was sent"
            start = time.monotonic()
            peer.sendall((100).to_bytes(4, "big"))  # an answer of 100 bytes, announced...
            ended = None
            peer.settimeout(0.2)
            for _ in range(100):  # ...and sent a byte every 0.2 s: 20 s in all
                try:
                    peer.sendall(b"x")
                    if peer.recv(4096) == b"":
                        ended = time.monotonic() - start
                        break
                except TimeoutError:
                    continue  # nothing to read: the inbox still waits for the answer
                except OSError:
                    ended = time.monotonic() - start
                    break
        assert ended is not None, "the trickling peer kept its handshake for 20 s"
        assert ended < 5.0, ended
        assert request(inbox.address, "k" * 32, {"n": 1}, timeout=5) == {"echo": 1}
    finally:
        inbox.close()


def test_a_flood_of_silent_peers_costs_a_bounded_number_of_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each connection's handshake had a thread of its own, however many peers connected and
    said nothing: a flood of them cost a thread each (and a descriptor) until its deadline.
    At most MAX_HANDSHAKES run at once now: each newer peer takes the place of the oldest once
    that one has run CUT_AFTER seconds, and its connection ends; once the flood is in, the
    newest MAX_HANDSHAKES hold the only handshake threads left, and a real peer is answered."""
    from creditflow.spark import _messages

    monkeypatch.setattr(_messages, "MAX_HANDSHAKES", 3)
    monkeypatch.setattr(_messages, "CUT_AFTER", 0.5)
    inbox = _echo_inbox("flooded-inbox")
    silent = [_raw_peer(inbox) for _ in range(12)]

    def handshakes() -> int:
        return sum(1 for t in threading.enumerate() if t.name == "flooded-inbox-peer")

    try:
        for sock in silent[:-3]:
            sock.settimeout(10)  # a timeout fails the test: it was not cut
            while sock.recv(4096):
                pass
        poll("three handshake threads left", lambda: handshakes() == 3, deadline=10)
        counts = set()
        for _ in range(10):
            counts.add(handshakes())
            time.sleep(0.05)
        assert counts == {3}, counts
    finally:
        for sock in silent:
            sock.close()
    try:
        assert request(inbox.address, "k" * 32, {"n": 1}, timeout=10) == {"echo": 1}
    finally:
        inbox.close()


def test_a_flood_of_silent_peers_holds_up_a_real_one_for_less_than_the_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With every handshake place taken by peers that connected and said nothing, a real peer
    waited in the backlog until their deadline (HANDSHAKE_TIMEOUT, 20 s) freed one, however
    long they meant to stay. A connection that finds no place free now cuts short the oldest
    handshake once it has run CUT_AFTER seconds: the real peer is answered while the silent
    ones are still connected, and the ones cut see their connection end."""
    from creditflow.spark import _messages

    monkeypatch.setattr(_messages, "MAX_HANDSHAKES", 3)
    monkeypatch.setattr(_messages, "CUT_AFTER", 0.5)
    inbox = _echo_inbox("crowded-inbox")
    silent = [_raw_peer(inbox) for _ in range(12)]
    try:
        done, answer = _in_thread(lambda: request(inbox.address, "k" * 32, {"n": 1}, timeout=5), 10)
        assert done, "the silent peers held up a real one"
        assert answer == {"echo": 1}
        # The first of them was cut short: its connection ended (after the challenge, or before
        # it when cut as its handshake began); a timeout here fails the test.
        silent[0].settimeout(5)
        while silent[0].recv(4096):
            pass
    finally:
        for sock in silent:
            sock.close()
        inbox.close()


def test_a_listener_that_never_completes_the_handshake_fails_the_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A request to an address that accepts the connection but never speaks (a stopped
    receiver: the kernel still accepts) raised nothing, ever; it now fails with TimeoutError
    naming the address once the handshake's deadline passed."""
    from creditflow.spark import _messages

    monkeypatch.setattr(_messages, "HANDSHAKE_TIMEOUT", 1.0)
    with socket.create_server(("127.0.0.1", 0)) as mute:
        address = f"127.0.0.1:{mute.getsockname()[1]}"
        done, error = _in_thread(lambda: request(address, "k" * 32, {"n": 1}, timeout=5), 20)
    assert done, "the request still waits for the handshake"
    assert isinstance(error, TimeoutError), error
    assert f"{address} did not complete the handshake within 1.0 s" in str(error)
