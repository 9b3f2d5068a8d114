"""Faults between real processes: a peer killed mid-stream,
garbage on the listener, and head-of-line blocking in credit versus tcp flow control.

Workers are ``tests/remote_worker.py`` processes; SIGKILL leaves them no chance to say goodbye,
so what the survivor sees is what the kernel does with a dead process's sockets.
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
from helpers import Producer
from remote_worker import Tracker, Worker, seq_batch, wait_all_segments_free

#: Every test runs over shared memory and over TCP (the ``transport`` fixture, conftest.py).
pytestmark = pytest.mark.usefixtures("transport")

#: A peer's death must reach the survivor within this (a correctness bound, not a timing).
DEATH_NOTICE = 2.0


def endless_seq_producer(part: cf.ResultPartition) -> tuple[Producer, list[int]]:
    """Writes ``seq`` batches into ``part`` until a write fails; ``[written]`` counts them."""
    written = [0]

    def body() -> None:
        with cf.RecordWriter(part, cf.RoundRobinPartitioner(), timeout=30) as w:
            while True:
                w.write(seq_batch(0, written[0], part.num_subpartitions, 4096))
                written[0] += 1

    p = Producer(body)
    p.start()
    return p, written


# ---------------------------------------------------------------------------- killed peers


def read_until_connection_lost(gate: cf.InputGate, tracker: Tracker) -> float:
    """Reads what a killed producer had sent into ``tracker`` until the gate raises
    ConnectionLostError (within 10 s, else the test fails); returns the seconds it took."""
    killed = time.monotonic()
    with pytest.raises(cf.ConnectionLostError):  # noqa: PT012 (queued batches come first)
        while time.monotonic() - killed < 10:
            try:
                b = gate.next(timeout=0.1)
            except cf.TimeoutError:
                continue
            assert b is not None, "a killed producer's stream must not look complete"
            tracker.add(b)
    return time.monotonic() - killed


def test_producer_killed_mid_stream(workers: list[Worker]) -> None:
    spec = {
        "id": "p",
        "subpartitions": 1,
        "partitioner": "forward",
        "data": "seq",
        "count": None,
        "rows": 4096,
    }
    workers.append(p := Worker("producer", env={"memory": "4MiB"}, partitions=[spec]))
    addr = p.wait_for("address")["address"]
    with cf.NetworkEnvironment(memory="4MiB") as env:
        gate = env.create_input_gate([cf.ChannelSpec(addr, "p", 0)])
        tracker = Tracker()
        for _ in range(20):
            b = gate.next(timeout=10)
            assert b is not None
            tracker.add(b)
        p.kill()
        noticed = read_until_connection_lost(gate, tracker)
        assert noticed < DEATH_NOTICE, f"the consumer noticed the death after {noticed:.2f} s"
        s = tracker.stats()
        assert (s["duplicated"], s["out_of_order"], s["corrupted"]) == (0, 0, 0)
        assert s["unique"]["0/0"] == s["batches"]
        gate.close()
        wait_all_segments_free(env.metrics, "consumer")


def test_consumer_killed_while_the_producer_is_backpressured(workers: list[Worker]) -> None:
    with cf.NetworkEnvironment(memory="4MiB") as env:
        part = env.create_partition("p", 1)
        cfg = {"env": {"memory": "4MiB"}, "gates": [[[env.address, "p", 0]]], "data": "seq", "pause_after": 5}
        workers.append(c := Worker("consumer", **cfg))
        producer, written = endless_seq_producer(part)
        c.wait_for("paused")
        # Blocked by backpressure: nothing written for a while, and the writer's meter says
        # HIGH (more than half of the last second spent waiting for a buffer).
        last, still = written[0], time.monotonic()
        deadline = still + 10
        while time.monotonic() - still < 0.5 or part.metrics()["level"] != "HIGH":
            time.sleep(0.05)
            if written[0] != last:
                last, still = written[0], time.monotonic()
            assert producer.is_alive(), producer.error
            assert time.monotonic() < deadline, f"the producer is not blocked: {part.metrics()}"
        c.kill()
        killed = time.monotonic()
        producer.join(10)
        noticed = time.monotonic() - killed
        with pytest.raises(cf.ConnectionLostError):
            producer.finish(0)
        assert noticed < DEATH_NOTICE, f"the producer noticed the death after {noticed:.2f} s"
        part.release()
        wait_all_segments_free(env.metrics, "producer")


def test_wait_consumed_fails_when_a_consumer_is_killed_before_reading_everything(
    workers: list[Worker],
) -> None:
    """A finished partition whose consumer died with data unread is not consumed: waiting for
    it must fail, not return as if everything had been delivered."""
    # The producer holds the whole stream (about 10 MB); the consumer's 4 MiB cannot, so the
    # end of the partition is still queued when the consumer dies.
    with cf.NetworkEnvironment(memory="64MiB") as env:
        part = env.create_partition("p", 1)
        cfg = {"env": {"memory": "4MiB"}, "gates": [[[env.address, "p", 0]]], "data": "seq", "pause_after": 2}
        workers.append(c := Worker("consumer", **cfg))
        with cf.RecordWriter(part, cf.RoundRobinPartitioner(), timeout=30) as w:
            for i in range(100):
                w.write(seq_batch(0, i, 1, 4096))
        c.wait_for("paused")
        c.kill()
        with pytest.raises(cf.ConnectionLostError, match="went away"):
            part.wait_consumed(timeout=10)
        wait_all_segments_free(env.metrics, "producer")


# --------------------------------------------------------------------------- garbage peers

MAGIC = b"CFLW"
PROTOCOL_VERSION = 6  # codec::PROTOCOL_VERSION
HELLO, AUTH_PROOF, ERROR_RESPONSE = 1, 3, 8
AUTHENTICATION = 3  # error kind
SEGMENT = 32 * 1024


def frame(msg_type: int, body: bytes, *, magic: bytes = MAGIC, length: int | None = None) -> bytes:
    """A frame: u32 LE length (whole frame), magic, protocol version, type, body."""
    total = 10 + len(body) if length is None else length
    return struct.pack("<I4sBB", total, magic, PROTOCOL_VERSION, msg_type) + body


def hello(auth: int) -> bytes:
    nonce = random.Random(auth).randbytes(32)
    # ... then no shared-memory offer (flag 0, boot id, uid, pid, key): this peer stays on TCP.
    return frame(
        HELLO, struct.pack("<BIIB", PROTOCOL_VERSION, SEGMENT, SEGMENT + 35, auth) + nonce + bytes(33)
    )


def read_to_close(sock: socket.socket, timeout: float = 5.0) -> bytes:
    """Everything the env sends until it closes the connection (EOF, or a reset when it
    closed with our bytes unread); fails if it is still open after ``timeout``."""
    sock.settimeout(timeout)
    got = b""
    try:
        while chunk := sock.recv(65536):
            got += chunk
    except ConnectionResetError:
        pass
    except TimeoutError:
        pytest.fail(f"the env kept the connection open for {timeout} s (got {got[:80]!r})")
    return got


def garbage_peer(addr: str, name: str) -> bytes:
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        if name == "random bytes":
            s.sendall(random.Random(7).randbytes(64))
        elif name == "wrong magic":
            s.sendall(frame(HELLO, bytes(42), magic=b"XXXX"))
        elif name == "2 GiB frame":
            s.sendall(frame(HELLO, b"", length=2**31))
        elif name == "hello without auth":
            s.sendall(hello(auth=0))
        elif name == "wrong hmac":
            s.sendall(hello(auth=1))
            ack = s.recv(10 + 107, socket.MSG_WAITALL)
            assert ack[4:10] == MAGIC + bytes([PROTOCOL_VERSION, 2]), f"expected a HelloAck, got {ack!r}"
            server_nonce = ack[10 + 10 : 10 + 42]
            tag = hmac.new(b"not the secret", server_nonce, hashlib.sha256).digest()
            s.sendall(frame(AUTH_PROOF, tag))
        else:
            raise AssertionError(name)
        return read_to_close(s)


def error_kind(reply: bytes) -> int:
    """The error kind of a reply that is one fatal ErrorResponse (type 8: scope u8, rid u64,
    kind u16, message)."""
    (length,) = struct.unpack_from("<I", reply)
    assert length == len(reply), reply
    assert reply[4:10] == MAGIC + bytes([PROTOCOL_VERSION, ERROR_RESPONSE]), reply
    scope, rid, kind = struct.unpack_from("<BQH", reply, 10)
    assert (scope, rid) == (0, 0), reply
    return int(kind)


GARBAGE = ["random bytes", "wrong magic", "2 GiB frame", "hello without auth", "wrong hmac"]


def test_garbage_peers_are_closed_while_a_healthy_exchange_completes(workers: list[Worker]) -> None:
    count = 300
    spec = {
        "id": "p",
        "subpartitions": 1,
        "partitioner": "forward",
        "data": "seq",
        "count": count,
        "rows": 4096,
    }
    env_cfg = {"memory": "1MiB", "secret": "s3cret"}  # small: the producer stays backpressured
    workers.append(p := Worker("producer", env=env_cfg, partitions=[spec]))
    addr = p.wait_for("address")["address"]
    tracker = Tracker()
    with cf.NetworkEnvironment(memory="1MiB", secret="s3cret") as env:
        gate = env.create_input_gate([cf.ChannelSpec(addr, "p", 0)])
        for _ in range(10):
            b = gate.next(timeout=10)
            assert b is not None
            tracker.add(b)
        # All at once, while the exchange is mid-stream on the same listener.
        answers: dict[str, bytes | BaseException] = {}

        def run(name: str) -> None:
            try:
                answers[name] = garbage_peer(addr, name)
            except BaseException as exc:  # reported below
                answers[name] = exc

        threads = [threading.Thread(target=run, args=(n,)) for n in GARBAGE]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert sorted(answers) == sorted(GARBAGE)
        for name, answer in answers.items():
            if isinstance(answer, BaseException):
                raise AssertionError(f"{name}: {answer!r}") from answer
            if name in ("hello without auth", "wrong hmac"):
                assert error_kind(answer) == AUTHENTICATION, f"{name}: {answer!r}"
        while (b := gate.next(timeout=10)) is not None:
            tracker.add(b)
    assert tracker.stats() == {
        **tracker.stats(),
        "unique": {"0/0": count},
        "duplicated": 0,
        "out_of_order": 0,
        "corrupted": 0,
    }
    assert p.wait_for("finished")["batches"] == count


# --------------------------------------------------------------------------- head of line

STALL = 3.0  # seconds gate A stops reading
PACE = 0.01  # seconds between the producer's writes (round robin: every other one is B's)


def head_of_line(flow_control: str) -> dict[str, int]:
    """One partition of 2 subpartitions written at a steady pace (well below what the
    connection carries); a consumer process reads them through two gates over one shared
    connection, and gate A stops reading for STALL seconds. Counts B's batches."""
    with cf.NetworkEnvironment(memory="64MiB", flow_control=flow_control) as env:
        part = env.create_partition("p", 2)
        gates = [[[env.address, "p", 0]], [[env.address, "p", 1]]]
        cfg = {"env": {"flow_control": flow_control}, "gates": gates, "data": "seq", "times": True}
        with Worker("consumer", **cfg) as c:
            stop = threading.Event()
            written = [0]

            def body() -> None:
                with cf.RecordWriter(part, cf.RoundRobinPartitioner(), timeout=30) as w:
                    t0 = time.monotonic()
                    while not stop.is_set():
                        w.write(seq_batch(0, written[0], 2, 2048))  # 32-64 KB
                        written[0] += 1
                        time.sleep(max(0.0, t0 + written[0] * PACE - time.monotonic()))

            producer = Producer(body)
            producer.start()
            time.sleep(0.5 + STALL)  # warm-up, then a window as long as the stall
            c.send(cmd="stall", gate=0, seconds=STALL)
            time.sleep(STALL + 0.5)
            stop.set()
            producer.finish()
            a, b = c.wait_for("done")["done"]
    for g in (a, b):
        assert (g["duplicated"], g["out_of_order"], g["corrupted"]) == (0, 0, 0)
    assert a["batches"] + b["batches"] == written[0], "every batch arrived"
    ((s0, s1),) = a["stalls"]
    return {
        "solo": sum(s0 - STALL <= t < s0 for t in b["times"]),  # B's batches in the window before
        "stall": sum(s0 <= t < s1 for t in b["times"]),  # ... while A does not read
        "stall_late": sum(s0 + STALL / 2 <= t < s1 for t in b["times"]),  # ... its second half
    }


@pytest.mark.slow
def test_head_of_line_credit_mode_keeps_the_other_channel_flowing() -> None:
    n = head_of_line("credit")
    assert n["solo"] >= 20, n  # the producer ran (50 B batches a second are written)
    assert n["stall"] > 0.5 * n["solo"], n
    assert n["stall_late"] > 0, n


@pytest.mark.slow
def test_head_of_line_tcp_mode_stalls_the_whole_connection() -> None:
    n = head_of_line("tcp")
    assert n["solo"] >= 20, n
    # B gets only what was already in flight (socket and gate buffers: a few batches on
    # loopback), then nothing until A reads again.
    assert n["stall"] < 0.2 * n["solo"], n
    assert n["stall_late"] == 0, n
