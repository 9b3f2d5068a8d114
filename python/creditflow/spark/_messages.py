"""Small authenticated control messages between Spark tasks and a driver or consumer process.

The data goes through creditflow; this only carries who-is-where (a task's environment
address and partition id) and live metrics. It uses :mod:`multiprocessing.connection`'s HMAC
challenge-response with the shared key before any message, and sends JSON documents (never
pickles), at most :data:`MAX_MESSAGE` bytes each. Each handshake has its own thread and a
deadline (:data:`HANDSHAKE_TIMEOUT`, for the whole handshake) on both sides, so a peer that
connects and says nothing, or trickles a byte now and then (a port scanner, a stopped process,
a slowloris) holds up only its own connection, and that for the deadline at most; at most
:data:`MAX_HANDSHAKES` run at once, so a flood of such peers costs a bounded number of threads.
A peer accepted while all are taken cuts short the oldest once it has run :data:`CUT_AFTER`
seconds (a real peer's handshake takes a round trip or two), so such a flood holds up a real peer
for about that long, not for the deadline, and a burst of real peers cuts none of them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import multiprocessing
import os
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection, Listener, answer_challenge, deliver_challenge
from typing import Any

#: Largest control message accepted.
MAX_MESSAGE = 1 << 20

#: Seconds a peer has to connect, and to complete the handshake once connected.
CONNECT_TIMEOUT = 20.0
HANDSHAKE_TIMEOUT = 20.0

#: Connections of one inbox whose handshake may run at once (authenticated ones are not
#: counted: a thousand tasks' reporters stay connected to the driver's); one more cuts the
#: oldest short once it has run for :data:`CUT_AFTER` seconds.
MAX_HANDSHAKES = 64
CUT_AFTER = 5.0

Message = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Then:
    """A reply, and what to do once it was sent (or could not be): an action the peer must
    not see before its answer (ending a stream whose consumer then closes the inbox)."""

    answer: Message
    after: Callable[[], None]


#: Handles one message; returns the reply, or None when the peer expects none.
Handler = Callable[[Message], "Message | Then | None"]


def _split(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected an address 'host:port', got {address!r}")
    return host.strip("[]"), int(port)


def _no_delay(conn: Connection) -> Connection:
    """``conn`` with Nagle's algorithm off. The handshake ends with a write of the client's,
    and a message written right after it would wait for that write's ACK, which the other
    side delays (up to 40 ms on Linux) as it has nothing to send back yet: every message
    would take that long."""
    with contextlib.suppress(OSError), socket.socket(fileno=os.dup(conn.fileno())) as s:
        if s.family in (socket.AF_INET, socket.AF_INET6):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


@contextlib.contextmanager
def _deadline(conn: Connection, seconds: float, expired: threading.Event) -> Iterator[None]:
    """The block has ``seconds`` to finish its reads and writes on ``conn``: then ``expired``
    is set and the connection shut down, which ends a read or write in progress (a peer that
    says nothing, or trickles a byte now and then)."""
    with socket.socket(fileno=os.dup(conn.fileno())) as s:

        def cut() -> None:
            expired.set()
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

        timer = threading.Timer(seconds, cut)
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            # Joined before the socket closes: a cut in progress never meets a reused descriptor.
            timer.cancel()
            timer.join()


def _handshake(conn: Connection, key: bytes, *, server: bool, address: str) -> None:
    """The HMAC challenge-response of :mod:`multiprocessing.connection` (each side proves it
    has ``key``), within :data:`HANDSHAKE_TIMEOUT`; raises TimeoutError naming ``address``
    when the peer stays silent or too slow, ``AuthenticationError`` for a wrong key."""
    expired = threading.Event()
    try:
        with _deadline(conn, HANDSHAKE_TIMEOUT, expired):
            if server:
                deliver_challenge(conn, key)
                answer_challenge(conn, key)
            else:
                answer_challenge(conn, key)
                deliver_challenge(conn, key)
    except (EOFError, OSError):
        if not expired.is_set():
            raise
        raise TimeoutError(f"{address} did not complete the handshake within {HANDSHAKE_TIMEOUT} s") from None


def _connect(address: str, key: str) -> Connection:
    """An authenticated connection to the :class:`Inbox` at ``address``; raises OSError
    (TimeoutError past :data:`CONNECT_TIMEOUT` or :data:`HANDSHAKE_TIMEOUT`) or
    ``AuthenticationError``."""
    sock = socket.create_connection(_split(address), timeout=CONNECT_TIMEOUT)
    sock.settimeout(None)
    conn = _no_delay(Connection(sock.detach()))
    try:
        _handshake(conn, key.encode(), server=False, address=address)
    except BaseException:
        conn.close()
        raise
    return conn


def _ask(conn: Connection, address: str, message: Message, timeout: float) -> Message:
    """Sends ``message`` on ``conn`` and returns the answer."""
    conn.send_bytes(json.dumps(message).encode())
    if not conn.poll(timeout):
        raise TimeoutError(f"no answer from {address} within {timeout} s")
    answer: Message = json.loads(conn.recv_bytes(MAX_MESSAGE))
    return answer


def send(address: str, key: str, message: Message, *, reply: bool = False, timeout: float = 30.0) -> Message:
    """Sends one message to the :class:`Inbox` at ``address``; with ``reply``, waits (at most
    ``timeout`` seconds) for the answer and returns it."""
    conn = _connect(address, key)
    try:
        if reply:
            return _ask(conn, address, message, timeout)
        conn.send_bytes(json.dumps(message).encode())
        return {}
    finally:
        conn.close()


class _Kept:
    """Connections this process keeps open to the inboxes it asks (a Spark worker asks the
    same receivers task after task): a request on one costs a round trip, where a new
    connection costs three more for the authentication and a thread on the inbox's side.
    A connection is taken out while in use, so each serves one request at a time; a
    forked child drops its parent's."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._conns: OrderedDict[tuple[str, str], Connection] = OrderedDict()

    def take(self, address: str, key: str) -> Connection | None:
        with self._lock:
            if self._pid != os.getpid():
                self._conns.clear()  # the parent's sockets: never written to from here
                self._pid = os.getpid()
            return self._conns.pop((address, key), None)

    def give(self, address: str, key: str, conn: Connection) -> None:
        with self._lock:
            if self._pid != os.getpid():
                conn.close()
                return
            stale = [c for c in [self._conns.pop((address, key), None)] if c is not None]
            self._conns[(address, key)] = conn
            while len(self._conns) > self._size:
                stale.append(self._conns.popitem(last=False)[1])
        for c in stale:
            c.close()


#: Inboxes a process keeps a connection to, at most (the least recently asked go first).
KEPT_CONNECTIONS = 64
_KEPT = _Kept(KEPT_CONNECTIONS)


#: The kind of message every :class:`Inbox` answers by itself with ``{"alive": True}``: a
#: sender's check that its receiver still runs.
ALIVE = "alive"


def request(address: str, key: str, message: Message, *, timeout: float = 30.0) -> Message:
    """Sends ``message`` to the :class:`Inbox` at ``address`` and returns its answer (waiting
    at most ``timeout`` seconds), over a connection kept open for the next request there.
    A kept connection that the inbox closed since (it closed, or went away) is replaced by a
    new one once; a request that timed out leaves its connection closed (its answer may yet
    come)."""
    conn = _KEPT.take(address, key)
    if conn is not None:
        try:
            answer = _ask(conn, address, message, timeout)
        except TimeoutError:
            conn.close()
            raise
        except (EOFError, OSError):
            conn.close()
        else:
            _KEPT.give(address, key, conn)
            return answer
    conn = _connect(address, key)
    try:
        answer = _ask(conn, address, message, timeout)
    except BaseException:
        conn.close()
        raise
    _KEPT.give(address, key, conn)
    return answer


class Outbox:
    """A connection that stays open for a stream of messages (live metrics)."""

    def __init__(self, address: str, key: str) -> None:
        self._conn: Connection = _connect(address, key)

    def send(self, message: Message) -> None:
        """Sends one message."""
        self._conn.send_bytes(json.dumps(message).encode())

    def close(self) -> None:
        """Closes the connection."""
        self._conn.close()


class _Handshakes:
    """An inbox's handshakes in progress, at most ``limit`` at once. A connection that finds
    none free waits for one; once the oldest has run for :data:`CUT_AFTER` seconds, it cuts that
    one short (shuts its socket down, which ends the handshake's read at once) and takes its
    place when its thread has let go."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._changed = threading.Condition()
        #: Each handshake's connection, oldest first: when it began, and a socket on a copy of
        #: its descriptor to shut it down by (the connection itself is its thread's to close).
        self._running: OrderedDict[Connection, tuple[float, socket.socket]] = OrderedDict()

    def begin(self, conn: Connection, closed: threading.Event) -> bool:
        """Counts ``conn``'s handshake once a place is free (cutting the oldest short when it is
        old enough); False when ``closed`` is set meanwhile (or ``conn`` was closed under it),
        and nothing is counted."""
        with self._changed:
            while len(self._running) >= self._limit:
                if closed.is_set():
                    return False
                began, oldest = next(iter(self._running.values()))
                age = time.monotonic() - began
                if age >= CUT_AFTER:
                    with contextlib.suppress(OSError):
                        oldest.shutdown(socket.SHUT_RDWR)
                self._changed.wait(timeout=min(0.5, max(0.01, CUT_AFTER - age)))
            try:
                self._running[conn] = (time.monotonic(), socket.socket(fileno=os.dup(conn.fileno())))
            except OSError:
                return False
            return True

    def end(self, conn: Connection) -> None:
        """``conn``'s handshake is over (done, failed or cut short): its place is free."""
        with self._changed:
            entry = self._running.pop(conn, None)
            self._changed.notify_all()
        if entry is not None:
            entry[1].close()


class Inbox:
    """Accepts authenticated peers on ``host`` (ephemeral port) and passes each message to
    ``handler`` on a thread of its own per peer; replies when the handler returns one."""

    def __init__(
        self,
        handler: Handler,
        *,
        host: str,
        key: str,
        name: str,
        on_end: Callable[[Message], None] | None = None,
    ) -> None:
        self._handler = handler
        #: Called with a connection's first message when its peer ends it (not on close()).
        self._on_end = on_end
        # multiprocessing's default backlog is 1: with many tasks connecting at once, the
        # kernel drops the final ACK of those that do not fit, their side counts as connected
        # and waits for the challenge forever (seen with a 16-task exchange's reporters).
        # No authkey: the listener would run the handshake in accept(), where one silent peer
        # holds up every other; each connection's thread runs it instead (_serve).
        self._listener = Listener((host, 0), backlog=socket.SOMAXCONN)
        self._key = key.encode()
        bound_host, port = self._listener.address
        self.address = f"{bound_host}:{port}"
        self._closed = threading.Event()
        self._conns: set[Connection] = set()
        self._lock = threading.Lock()
        self._handshakes = _Handshakes(MAX_HANDSHAKES)
        self._name = name
        self._thread = threading.Thread(target=self._accept, name=f"{name}-accept", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn = self._listener.accept()
            except (OSError, EOFError):
                continue  # closed, or a peer gone before it was accepted
            with self._lock:
                if self._closed.is_set():
                    conn.close()
                    return
                self._conns.add(conn)
            # A place for its handshake (the oldest one cut short when none is free); close()
            # is seen within the wait and then closes the connection.
            if not self._handshakes.begin(conn, self._closed):
                return
            _no_delay(conn)
            threading.Thread(target=self._serve, args=(conn,), name=f"{self._name}-peer", daemon=True).start()

    def _serve(self, conn: Connection) -> None:
        first: Message | None = None
        try:
            try:
                _handshake(conn, self._key, server=True, address="a peer")
            except (OSError, EOFError, TypeError, multiprocessing.AuthenticationError):
                return  # silent, gone, closed under it (TypeError), or a wrong key: drop it only
            finally:
                self._handshakes.end(conn)
            while not self._closed.is_set():
                try:
                    data = conn.recv_bytes(MAX_MESSAGE)
                except (EOFError, OSError, TypeError) as exc:
                    self._check_ended(exc)
                    if first is not None and self._on_end is not None and not self._closed.is_set():
                        self._on_end(first)
                    return
                message = json.loads(data)
                if first is None:
                    first = message
                reply = {"alive": True} if message.get("kind") == ALIVE else self._handler(message)
                answer = reply.answer if isinstance(reply, Then) else reply
                after = reply.after if isinstance(reply, Then) else None
                try:
                    if answer is not None:
                        conn.send_bytes(json.dumps(answer).encode())
                except (OSError, TypeError) as exc:
                    self._check_ended(exc)
                    return
                finally:
                    if after is not None:
                        after()
        finally:
            # Whoever takes the connection out of the set closes it: here, or close() (two
            # closes of one Connection from two threads can both reach os.close).
            with self._lock:
                mine = conn in self._conns
                self._conns.discard(conn)
            if mine:
                conn.close()

    def _check_ended(self, exc: BaseException) -> None:
        """Re-raises ``exc`` unless it only says that the connection ended: the peer went
        away (EOF, OSError), or close() closed it under a read or write here (its handle
        became None half-way: TypeError)."""
        if isinstance(exc, TypeError) and not self._closed.is_set():
            raise exc

    def close(self) -> None:
        """Stops accepting and closes every connection. Idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        # close() does not wake a thread blocked in accept(); a connection does.
        with contextlib.suppress(OSError), socket.create_connection(_split(self.address), timeout=1.0):
            pass
        self._thread.join(timeout=5.0)
        self._listener.close()
        with self._lock:
            conns = list(self._conns)
            self._conns.clear()
        for conn in conns:
            conn.close()
