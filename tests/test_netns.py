"""Impaired networks: producer and consumer run as separate hosts, in two network
namespaces joined by a veth pair, each with its own address (worker processes started with
``ip netns exec``). Checked: every batch arrives exactly once and in order unimpaired, under a
bandwidth cap (tc tbf), also with the producer's ``wire_compression`` (``"lz4"``, ``"zstd"``;
TPC-H-like ``lineitem`` batches), and under 20 ms delay with 1% loss each way; and a link cut longer
than ``peer_timeout`` fails the affected gate with ``ConnectionLostError`` (no hang, no silent
loss) while a connection not over that link keeps flowing. Each exchange prints its
throughput (``-s`` shows it).

Delay and loss: this machine's kernel has no ``sch_netem``, so they come from the
userspace wire of ``tests/wire.py`` (:func:`netns.wire`): a second link between the namespaces
through two TUN devices and a relay that holds every packet for the delay and drops a seeded
random fraction, both ways, the way ``tc netem delay 20ms loss 1%`` would on each end.

Needs root and a kernel that allows network namespaces and TUN devices; otherwise skipped with
the reason. Namespaces, devices and the relay are removed at the end, whatever happened.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from netns import Hosts, Unavailable, Wire, namespaces, wire
from remote_worker import Worker, make_batch, seq_partition

pytestmark = [pytest.mark.netns, pytest.mark.slow]

SECRET = "netns-secret"
ROWS = 4096
PEER_TIMEOUT = 2.0
CUT = 5.0  # seconds the link is down: longer than PEER_TIMEOUT
DELAY = 0.020  # seconds, each way
LOSS = 0.01  # each way


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    try:
        with namespaces(f"cf{os.getpid() % 100000}") as h:
            yield h
    except Unavailable as exc:
        pytest.skip(str(exc))


def env(bind: str = "127.0.0.1:0") -> dict[str, object]:
    return {"memory": "4MiB", "bind": bind, "secret": SECRET, "peer_timeout": PEER_TIMEOUT}


def payload_mb(count: int, data: str = "seq") -> float:
    """The Arrow size of the first ``count`` batches of ``data`` (before any compression)."""
    nbytes: int = sum(make_batch(data, i, producer=0, num_channels=1, rows=ROWS).nbytes for i in range(count))
    return nbytes / 1e6


@pytest.fixture
def impaired_wire(hosts: Hosts) -> Iterator[Wire]:
    try:
        with wire(hosts, delay=DELAY, loss=LOSS) as w:
            yield w
    except Unavailable as exc:
        pytest.skip(str(exc))


def exchange(
    h: Hosts,
    workers: list[Worker],
    count: int,
    name: str,
    via: str | None = None,
    data: str = "seq",
    **producer: object,
) -> None:
    """``count`` batches of ``data`` from a producer in namespace a (bound to ``via``, by
    default its veth address; ``producer``: more of its settings) to a consumer in namespace b:
    every batch exactly once and in order; prints the throughput."""
    via = via or h.addr_a
    p_env = {**env(f"{via}:0"), **producer}
    workers.append(
        p := Worker("producer", netns=h.a, env=p_env, partitions=[seq_partition(count, ROWS, data=data)])
    )
    addr = p.wait_for("address")["address"]
    assert addr.startswith(f"{via}:")
    workers.append(
        c := Worker("consumer", netns=h.b, env=env(), gates=[[[addr, "p", 0]]], data=data, times=True)
    )
    done = c.wait_for("done", timeout=300)["done"][0]
    assert (done["unique"], done["duplicated"], done["out_of_order"], done["corrupted"]) == (
        {"0/0": count},
        0,
        0,
        0,
    )
    assert p.wait_for("finished")["batches"] == count
    seconds = done["times"][-1] - done["times"][0]
    rate = payload_mb(count, data) / seconds
    print(f"\nnetns throughput, {name}: {rate:.1f} MB/s ({count} batches, {seconds:.2f} s)")


def test_unimpaired_link_delivers_everything_in_order(hosts: Hosts, workers: list[Worker]) -> None:
    exchange(hosts, workers, 300, "unimpaired veth")


def cap_bandwidth(hosts: Hosts) -> None:
    """100 Mbit/s on both ends of the veth (``tc tbf``)."""
    for ns, dev in ((hosts.a, hosts.dev_a), (hosts.b, hosts.dev_b)):
        r = hosts.tc(ns, dev, "tbf", "rate", "100mbit", "burst", "64kb", "latency", "50ms")
        assert r.returncode == 0, r.stderr


def test_bandwidth_cap_delivers_everything_in_order(hosts: Hosts, workers: list[Worker]) -> None:
    cap_bandwidth(hosts)
    exchange(hosts, workers, 100, "100 Mbit/s tbf cap")


@pytest.mark.parametrize("codec", [None, "lz4", "zstd"])
def test_bandwidth_cap_with_wire_compression_delivers_everything_in_order(
    hosts: Hosts, workers: list[Worker], codec: str | None
) -> None:
    cap_bandwidth(hosts)
    name = f"100 Mbit/s tbf cap, lineitem, wire_compression={codec}"
    exchange(hosts, workers, 40, name, data="lineitem", wire_compression=codec)


CONNECT = """
import socket, sys, time
t = time.monotonic()
socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30).close()
print(time.monotonic() - t)
"""


def test_the_wire_delays_every_packet_both_ways(
    hosts: Hosts, impaired_wire: Wire, workers: list[Worker]
) -> None:
    # A TCP connect over the wire takes at least one round trip: SYN a->b, SYN-ACK b->a, each
    # held DELAY. (A lower bound: load can only make it slower.)
    workers.append(
        p := Worker("producer", netns=hosts.a, env=env(f"{impaired_wire.addr_a}:0"), partitions=[])
    )
    port = p.wait_for("address")["address"].rsplit(":", 1)[1]
    r = subprocess.run(
        ["ip", "netns", "exec", hosts.b, sys.executable, "-c", CONNECT, impaired_wire.addr_a, port],
        capture_output=True,
        text=True,
        check=True,
    )
    assert float(r.stdout) >= 2 * DELAY, r.stdout
    stats = impaired_wire.stats()
    assert stats["a>b"]["sent"] > 0, stats
    assert stats["b>a"]["sent"] > 0, stats


def test_delay_and_loss_deliver_everything_in_order(
    hosts: Hosts, impaired_wire: Wire, workers: list[Worker]
) -> None:
    exchange(hosts, workers, 100, "20 ms delay, 1% loss (userspace wire)", via=impaired_wire.addr_a)
    stats = impaired_wire.stats()
    print(f"wire: {stats}")
    # The loss really happened, both ways (about 1% of thousands of packets each way).
    for direction in ("a>b", "b>a"):
        assert stats[direction]["dropped"] > 0, stats
        assert (stats[direction]["delay"], stats[direction]["loss"]) == (DELAY, LOSS), stats


def test_a_cut_longer_than_peer_timeout_fails_that_gate_while_another_connection_flows(
    hosts: Hosts, workers: list[Worker]
) -> None:
    h = hosts
    # Producer "far" in a (over the veth), producer "near" in b (over b's loopback), one
    # consumer in b reading both, each in its own gate, continuously (both write until told).
    workers.append(
        far := Worker("producer", netns=h.a, env=env(f"{h.addr_a}:0"), partitions=[seq_partition(None, ROWS)])
    )
    workers.append(near := Worker("producer", netns=h.b, env=env(), partitions=[seq_partition(None, ROWS)]))
    far_addr, near_addr = far.wait_for("address")["address"], near.wait_for("address")["address"]
    workers.append(
        c := Worker(
            "consumer",
            netns=h.b,
            env=env(),
            gates=[[[far_addr, "p", 0]], [[near_addr, "p", 0]]],
            data="seq",
            times=True,
        )
    )
    c.send(cmd="report")
    while min(c.wait_for("report")["report"]) < 20:  # both gates are flowing
        time.sleep(0.1)
        c.send(cmd="report")
    h.link(up=False)
    cut_at = time.monotonic()
    try:
        failure = c.wait_for("error", timeout=30)
        noticed = time.monotonic() - cut_at
    finally:
        time.sleep(max(0.0, cut_at + CUT - time.monotonic()))
        h.link(up=True)
    assert failure["where"] == "gate 0", failure
    assert failure["type"] == "ConnectionLostError", failure
    print(f"\nnetns cut of {CUT:.0f} s, peer_timeout {PEER_TIMEOUT:.0f} s: gate failed after {noticed:.1f} s")
    # The other connection kept flowing through the cut: stop its producer, read its end.
    near.send(cmd="stop")
    done = c.wait_for("done", timeout=60)["done"]
    sent = near.wait_for("finished")["batches"]
    far_gate, near_gate = done
    assert (
        near_gate["unique"],
        near_gate["duplicated"],
        near_gate["out_of_order"],
        near_gate["corrupted"],
    ) == (
        {"0/0": sent},
        0,
        0,
        0,
    )
    assert sum(1 for t in near_gate["times"] if t > cut_at + noticed) > 0, "the other gate stopped at the cut"
    # What the failed gate got before failing is a clean prefix: nothing twice, nothing reordered.
    assert (far_gate["duplicated"], far_gate["out_of_order"], far_gate["corrupted"]) == (0, 0, 0)
