"""Limits against abuse: a producer process with small limits serves a healthy
exchange while abusive peers hit each limit on the same listener, one after the other: garbage,
an unauthenticated peer, a slowloris peer, too many channels on one connection, too many
connections, and a peer that floods requests without reading the answers. Each is refused;
the healthy exchange still delivers every batch exactly once and in order.
"""

from __future__ import annotations

import hashlib
import hmac
import random
import socket
import struct
import threading
import time

import pytest

import creditflow as cf
from remote_worker import Tracker, Worker
from test_faults import AUTH_PROOF, MAGIC, PROTOCOL_VERSION, error_kind, frame, hello, read_to_close

#: Every test runs over shared memory and over TCP (the ``transport`` fixture, conftest.py).
pytestmark = pytest.mark.usefixtures("transport")

SECRET = b"s3cret"
HANDSHAKE_TIMEOUT = 2.0
LIMITS = {"max_connections": 3, "max_channels_per_connection": 2, "max_outstanding_requests": 8}
PROTOCOL, AUTHENTICATION, LIMIT_EXCEEDED = 2, 3, 7  # error kinds
PARTITION_REQUEST = 4
HELLO_ACK_LEN = 10 + 107
#: Healthy batches, read at a pace that keeps the exchange going while the abuse runs.
COUNT = 200
PACE = 0.02


def connect(addr: str) -> socket.socket:
    host, port = addr.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def authenticated(addr: str) -> socket.socket | None:
    """A raw connection that completes the shared-secret handshake, or ``None`` if the
    environment refused it for ``max_connections``."""
    s = connect(addr)
    s.sendall(hello(auth=1))
    ack = s.recv(HELLO_ACK_LEN, socket.MSG_WAITALL)
    if ack[4:10] == MAGIC + bytes([PROTOCOL_VERSION, 8]):
        reply = ack + read_to_close(s)
        s.close()
        assert error_kind(reply) == LIMIT_EXCEEDED, reply
        return None
    assert ack[4:10] == MAGIC + bytes([PROTOCOL_VERSION, 2]), f"expected a HelloAck, got {ack!r}"
    server_nonce = ack[10 + 10 : 10 + 42]
    tag = hmac.new(SECRET, b"creditflow-auth-v1" + bytes([1]) + server_nonce, hashlib.sha256).digest()
    s.sendall(frame(AUTH_PROOF, tag))
    return s


def admitted(addr: str) -> socket.socket:
    """:func:`authenticated`, retried while slots of connections that just closed are still
    taken (the environment frees them when it sees the close)."""
    deadline = time.monotonic() + 10
    while (s := authenticated(addr)) is None:
        assert time.monotonic() < deadline, "no connection slot came free"
        time.sleep(0.05)
    return s


def partition_request(rid: int, partition: bytes) -> bytes:
    body = struct.pack("<QII", rid, 0, 1) + struct.pack("<I", len(partition)) + partition
    return frame(PARTITION_REQUEST, body)


def read_until_limit(gate: cf.InputGate) -> cf.LimitExceededError:
    """Reads ``gate`` until it fails; the failure must be a :class:`cf.LimitExceededError`."""
    with pytest.raises(cf.LimitExceededError) as info:  # noqa: PT012 (batches may come first)
        while gate.next(timeout=10) is not None:
            pass
    return info.value


@pytest.fixture
def producer(workers: list[Worker]) -> Worker:
    """A producer with small limits: ``p`` (1 channel, the healthy exchange, ``COUNT``
    batches) and ``q`` (3 channels, 30 batches, for the abusers)."""
    env = {"memory": "2MiB", "secret": SECRET.decode(), "handshake_timeout": HANDSHAKE_TIMEOUT, **LIMITS}
    p = {"id": "p", "subpartitions": 1, "partitioner": "forward", "data": "seq", "count": COUNT, "rows": 1024}
    q = {"id": "q", "subpartitions": 3, "partitioner": "round_robin", "data": "seq", "count": 30, "rows": 64}
    workers.append(w := Worker("producer", env=env, partitions=[p, q]))
    return w


def test_each_abusive_peer_is_refused_while_a_healthy_exchange_continues(producer: Worker) -> None:
    addr = producer.wait_for("address")["address"]
    tracker = Tracker()
    failure: list[BaseException] = []
    with cf.NetworkEnvironment(memory="1MiB", secret=SECRET) as env:
        gate = env.create_input_gate([cf.ChannelSpec(addr, "p", 0)])

        def healthy() -> None:
            try:
                while (b := gate.next(timeout=30)) is not None:
                    tracker.add(b)
                    time.sleep(PACE)
            except BaseException as exc:  # reported below
                failure.append(exc)

        reader = threading.Thread(target=healthy)
        reader.start()

        # Garbage before the handshake: closed, at most with a protocol error.
        with connect(addr) as s:
            s.sendall(random.Random(7).randbytes(64))
            reply = read_to_close(s)
            assert reply == b"" or error_kind(reply) == PROTOCOL, reply

        # No secret: refused with an authentication error.
        with connect(addr) as s:
            s.sendall(hello(auth=0))
            assert error_kind(read_to_close(s)) == AUTHENTICATION

        # Slowloris: a Hello one byte every 0.1 s takes longer than the handshake timeout.
        with connect(addr) as s:
            hello_bytes = hello(auth=1)
            s.settimeout(0.1)
            sent, closed = 0, False
            while sent < len(hello_bytes) and not closed:
                try:
                    s.sendall(hello_bytes[sent : sent + 1])
                    sent += 1
                    closed = s.recv(1) == b""  # anything but the timeout: the end
                except TimeoutError:
                    continue
                except (ConnectionResetError, BrokenPipeError):
                    closed = True
            assert closed, f"the whole Hello went out one byte at a time ({sent} bytes)"
            assert sent < len(hello_bytes), f"dropped only after {sent} bytes"

        # Three channels on one connection: the third is refused, naming the setting.
        with cf.NetworkEnvironment(memory="1MiB", secret=SECRET) as abuser:
            g = abuser.create_input_gate([cf.ChannelSpec(addr, "q", i) for i in range(3)])
            err = read_until_limit(g)
            assert "max_channels_per_connection=2" in str(err), err

        # A fourth connection (the healthy one and two raw ones hold the three slots).
        held = [admitted(addr), admitted(addr)]
        with cf.NetworkEnvironment(memory="1MiB", secret=SECRET) as abuser:
            g = abuser.create_input_gate([cf.ChannelSpec(addr, "q", 0)])
            err = read_until_limit(g)
            assert "max_connections=3" in str(err), err
        for s in held:
            s.close()

        # Requests without reading the answers: the connection is closed once more than
        # max_outstanding_requests answers are queued behind the full socket buffers.
        with admitted(addr) as s:
            flood = b"".join(partition_request(rid, b"nope") for rid in range(1000))
            with pytest.raises((BrokenPipeError, ConnectionResetError)):  # noqa: PT012
                for _ in range(100_000):  # 3 GB: far beyond any socket buffer
                    s.sendall(flood)

        reader.join(60)
        assert not reader.is_alive()
        if failure:
            raise failure[0]
    stats = tracker.stats()
    assert (stats["unique"], stats["duplicated"], stats["out_of_order"], stats["corrupted"]) == (
        {"0/0": COUNT},
        0,
        0,
        0,
    )
    finished = {
        m["finished"]: m["batches"] for m in (producer.wait_for("finished"), producer.wait_for("finished"))
    }
    assert finished == {"p": COUNT, "q": 30}
