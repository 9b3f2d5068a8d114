"""Shared-memory channels between two real processes: exactness over shared
memory, the fallback to TCP when either side turns it off, a killed peer (noticed within 2 s,
its region unmapped), and batches a consumer holds staying as they were while the producer
goes on writing through the same rings.
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
import time

import pyarrow as pa
import pytest

import creditflow as cf
from helpers import assert_batches_equal
from remote_worker import Tracker, Worker, type_batch, wait_all_segments_free
from test_faults import read_until_connection_lost
from test_remote import ROWS, expected_per_channel, split_by_channel, start_producer

#: A peer's death must reach the survivor within this (a correctness bound, not a timing).
DEATH_NOTICE = 2.0


def transports(env: cf.NetworkEnvironment) -> set[str]:
    """The transports the channels of ``env``'s gates use."""
    return {
        c["remote"]["transport"]
        for g in env.metrics()["gates"].values()
        for c in g["channels"]
        if c["remote"]
    }


def shared_ranges() -> list[tuple[int, int]]:
    """Address ranges of this process's shared-memory region mappings
    (``memfd:creditflow-shm``)."""
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            if "creditflow-shm" in line:
                lo, hi = line.split()[0].split("-")
                out.append((int(lo, 16), int(hi, 16)))
    return out


def shared_mappings() -> int:
    """Mappings of shared-memory regions in this process."""
    return len(shared_ranges())


def in_shared_memory(b: pa.RecordBatch, ranges: list[tuple[int, int]]) -> bool:
    """Whether every buffer of ``b`` lies in a shared region (decoded in place)."""
    addresses = [buf.address for col in b.columns for buf in col.buffers() if buf is not None]
    return all(any(lo <= a < hi for lo, hi in ranges) for a in addresses)


def fds() -> dict[str, str]:
    """This process's open file descriptors and what they point at."""
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone
            out[fd] = os.readlink(f"/proc/self/fd/{fd}")
    return out


@pytest.mark.parametrize(
    ("producer_shm", "consumer_shm", "want"),
    [(True, True, "shm"), (False, True, "tcp"), (True, False, "tcp")],
    ids=["both-on", "producer-off", "consumer-off"],
)
def test_hash_exchange_is_exact_over_shared_memory_and_falls_back_to_tcp(
    workers: list[Worker], producer_shm: bool, consumer_shm: bool, want: str
) -> None:
    expected = expected_per_channel()
    workers.append(p := start_producer({"shared_memory": producer_shm}))
    addr = p.wait_for("address")["address"]
    with cf.NetworkEnvironment(memory="16MiB", shared_memory=consumer_shm) as env:
        gate = env.create_input_gate([cf.ChannelSpec(addr, "p", i) for i in range(4)])
        first = gate.next(timeout=30)
        assert first is not None
        assert transports(env) == {want}
        got = [first, *gate]
        for c, (g, w) in enumerate(zip(split_by_channel(got, expected), expected, strict=True)):
            assert len(g) == len(w), f"channel {c}"
            assert_batches_equal(g, w)
        gate.close()
        wait_all_segments_free(env.metrics, "consumer")


@pytest.mark.parametrize("shared_memory", [True, False], ids=["shm", "tcp"])
def test_both_sides_metrics_name_the_transport(shared_memory: bool) -> None:
    """The consumer's channels and the producer's subpartitions say what carries their frames."""
    want = "shm" if shared_memory else "tcp"
    with (
        cf.NetworkEnvironment(memory="16MiB", shared_memory=shared_memory) as producer,
        cf.NetworkEnvironment(memory="16MiB") as consumer,
    ):
        part = producer.create_partition("p", 2)
        gate = consumer.create_input_gate([cf.ChannelSpec(producer.address, "p", i) for i in range(2)])
        with cf.RecordWriter(part, cf.BroadcastPartitioner()) as w:
            w.write(type_batch(0, 100))
            first = gate.next(timeout=30)
            assert first is not None
            assert transports(consumer) == {want}  # while the channels are open
        got = [first, *gate]
        assert sum(b.num_rows for b in got) == 200
        remotes = [s["remote"] for s in part.metrics()["subpartitions"]]
        assert [r["transport"] if r else None for r in remotes] == [want, want]
        assert all(r and r["buffers_sent"] > 0 for r in remotes)
        gate.close()


def test_sixteen_channels_from_four_producers_are_exact_over_shared_memory(workers: list[Worker]) -> None:
    producers = []
    for n in range(4):
        spec = {
            "id": "p",
            "subpartitions": 4,
            "partitioner": "round_robin",
            "data": "seq",
            "count": 40,
            "rows": 4096,
        }
        spec["producer"] = n
        workers.append(w := Worker("producer", env={"memory": "8MiB"}, partitions=[spec]))
        producers.append(w)
    addrs = [w.wait_for("address")["address"] for w in producers]
    with cf.NetworkEnvironment(memory="16MiB") as env:
        gates = [env.create_input_gate([cf.ChannelSpec(a, "p", c) for a in addrs]) for c in range(4)]
        tracker = Tracker()
        for g in gates:
            first = g.next(timeout=30)
            assert first is not None
            tracker.add(first)
        assert transports(env) == {"shm"}
        for g in gates:
            for b in g:
                tracker.add(b)
        s = tracker.stats()
        assert (s["duplicated"], s["out_of_order"], s["corrupted"]) == (0, 0, 0)
        assert s["batches"] == 4 * 40
        assert s["unique"] == {f"{n}/{c}": 10 for n in range(4) for c in range(4)}
        for g in gates:
            g.close()


def test_batches_a_consumer_holds_do_not_change_while_more_data_flows(workers: list[Worker]) -> None:
    # Many times the rings' size goes through the link after the first batches are taken.
    count = 400
    workers.append(p := start_producer(subpartitions=1, partitioner="forward", count=count))
    addr = p.wait_for("address")["address"]
    with cf.NetworkEnvironment(memory="16MiB") as env:
        gate = env.create_input_gate([cf.ChannelSpec(addr, "p", 0)])
        held = [gate.next(timeout=30) for _ in range(8)]
        assert transports(env) == {"shm"}
        assert all(b is not None for b in held)
        before = [b.serialize().to_pybytes() for b in held if b is not None]
        rest = list(gate)
        assert len(rest) == count - len(held)
        assert [b.serialize().to_pybytes() for b in held if b is not None] == before
        assert_batches_equal(
            [b for b in held if b is not None], [type_batch(i, ROWS) for i in range(len(held))]
        )
        gate.close()


def start_writers(
    parts: dict[str, cf.ResultPartition], batches: list[pa.RecordBatch], count: int
) -> list[threading.Thread]:
    """A thread per partition writing ``count`` of ``batches`` in turn (a failed write ends it
    quietly: the test looks at what arrived)."""

    def write(part: cf.ResultPartition) -> None:
        with contextlib.suppress(cf.CreditflowError), cf.RecordWriter(part) as w:
            for i in range(count):
                w.write(batches[i % len(batches)])

    threads = [threading.Thread(target=write, args=(p,), daemon=True) for p in parts.values()]
    for t in threads:
        t.start()
    return threads


def test_a_gate_closed_in_the_middle_of_a_placed_record_leaves_the_link_serving_the_others() -> None:
    """Two gates of one consumer share one link to the producer. Closing one while the producer
    is still sending the buffers of a record it placed in the heap must not break the link:
    the other gate reads its whole stream."""
    count = 60
    with (
        cf.NetworkEnvironment(memory="64MiB") as producer,
        cf.NetworkEnvironment(memory="64MiB", floating_buffers=200) as consumer,
    ):
        parts = {n: producer.create_partition(n, 1) for n in ("a", "b")}
        batches = [type_batch(i, 20_000) for i in range(4)]  # about 1.6 MB each
        threads = start_writers(parts, batches, count)
        a = consumer.create_input_gate([cf.ChannelSpec(producer.address, "a", 0)])
        b = consumer.create_input_gate([cf.ChannelSpec(producer.address, "b", 0)])
        assert a.next(timeout=30) is not None
        first = b.next(timeout=30)
        assert transports(consumer) == {"shm"}
        a.close()
        got = [first, *b]
        assert len(got) == count
        assert_batches_equal([g for g in got if g is not None], [batches[i % 4] for i in range(count)])
        b.close()
        threads[1].join(30)
        assert not threads[1].is_alive()


def test_held_batches_fill_the_heap_then_records_come_inline_and_all_arrive_intact(
    workers: list[Worker],
) -> None:
    # 163 KB batches (three chunks each): the link's heap (a quarter of the producer's 16 MiB)
    # holds 21 of them.
    count = 800
    workers.append(p := start_producer(subpartitions=1, partitioner="forward", count=count))
    addr = p.wait_for("address")["address"]
    want = [type_batch(i, ROWS) for i in range(count)]
    with cf.NetworkEnvironment(memory="16MiB") as env:
        gate = env.create_input_gate([cf.ChannelSpec(addr, "p", 0)])
        held = [gate.next(timeout=30) for _ in range(300)]
        assert transports(env) == {"shm"}
        ranges = shared_ranges()
        placed = [in_shared_memory(b, ranges) for b in held if b is not None]
        # In place until the heap was full of held batches, then inline: no wait, no deadlock.
        assert placed[0], "the first batch was not decoded in place"
        assert 10 < sum(placed) < 100, f"{sum(placed)} of 300 held batches in place"
        assert_batches_equal([b for b in held if b is not None], want[:300])
        # Dropped, the held batches free the heap: the producer places records again.
        del held, placed
        gc.collect()
        rest = list(gate)
        assert len(rest) == count - 300
        ranges = shared_ranges()
        assert any(in_shared_memory(b, ranges) for b in rest), "the heap was not freed"
        assert_batches_equal(rest, want[300:])
        gate.close()


@pytest.mark.parametrize("shared_memory", [True, False], ids=["shm", "tcp"])
def test_a_record_placed_in_the_heap_goes_out_in_two_frames(shared_memory: bool) -> None:
    """Over shared memory a record in the heap costs the frames that take credit when it is
    sent inline (the one that starts it and the one that completes it) and no others; over
    TCP the same record is its first segment, then its body in bulk frames of up to 1 MiB:
    three for 1.6 MB. Read in lockstep, so no batch waits in the heap and every record is
    placed."""
    count, seg = 6, 32 << 10
    batches = [type_batch(i, 20_000) for i in range(count)]  # about 1.6 MB each
    with (
        cf.NetworkEnvironment(memory="64MiB", segment_size=seg, shared_memory=shared_memory) as producer,
        cf.NetworkEnvironment(memory="64MiB", segment_size=seg) as consumer,
    ):
        part = producer.create_partition("p", 1)
        gate = consumer.create_input_gate([cf.ChannelSpec(producer.address, "p", 0)])
        got = []
        with cf.RecordWriter(part, cf.ForwardPartitioner()) as w:
            for b in batches:
                w.write(b)
                got.append(gate.next(timeout=30))
                assert transports(consumer) == ({"shm"} if shared_memory else {"tcp"})
        assert gate.next(timeout=30) is None
        assert_batches_equal([g for g in got if g is not None], batches)
        ranges = shared_ranges()
        assert [in_shared_memory(g, ranges) for g in got if g is not None] == [shared_memory] * count
        remote = part.metrics()["subpartitions"][0]["remote"]
        assert remote is not None
        assert remote["buffers_sent"] == (2 if shared_memory else 3) * count
        gate.close()


def test_a_stalled_channel_leaves_half_the_heap_to_its_link_neighbour() -> None:
    """Two channels share one link; A's consumer never reads while it has credit for more
    records than the heap holds. A may take at most half the heap while B places records too,
    so B's records keep being decoded in place (without that, A's held records filled the heap
    and B's came inline)."""
    count = 60
    with (
        cf.NetworkEnvironment(memory="16MiB") as producer,  # a 4 MiB heap per link
        cf.NetworkEnvironment(memory="64MiB", floating_buffers=64) as consumer,
    ):
        parts = {n: producer.create_partition(n, 1) for n in ("a", "b")}
        batches = [type_batch(i, 6_000) for i in range(4)]  # about 0.5 MB each
        a = consumer.create_input_gate([cf.ChannelSpec(producer.address, "a", 0)])
        b = consumer.create_input_gate([cf.ChannelSpec(producer.address, "b", 0)])
        threads = start_writers(parts, batches, count)
        ranges: list[tuple[int, int]] = []
        placed = []
        for batch in b:  # each batch dropped before the next: B holds nothing
            ranges = ranges or shared_ranges()
            placed.append(in_shared_memory(batch, ranges))
            assert batch.equals(batches[(len(placed) - 1) % 4]), f"B's batch {len(placed) - 1}"
        assert len(placed) == count
        # Long after A's consumer stopped, B's records still find room in the heap (typically
        # a few in every ten; none once A's records had filled it).
        late = sum(placed[count // 2 :])
        assert late >= 3, "B's records in place: " + "".join("P" if p else "." for p in placed)
        assert len(list(a)) == count
        for t in threads:
            t.join(30)


def test_a_killed_producer_fails_the_gate_in_time_and_its_region_is_unmapped(workers: list[Worker]) -> None:
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
    mappings_before, fds_before = shared_mappings(), fds()
    with cf.NetworkEnvironment(memory="4MiB") as env:
        gate = env.create_input_gate([cf.ChannelSpec(addr, "p", 0)])
        tracker = Tracker()
        # Hold the latest batch decoded in place from the link's heap. Records the producer sent
        # while the heap was full of ones still queued here came inline (copied out of the
        # ring), and a batch of those holds no region: most of the first 20 are such.
        b = None
        for _ in range(20):
            nxt = gate.next(timeout=10)
            assert nxt is not None
            tracker.add(nxt)
            if in_shared_memory(nxt, shared_ranges()):
                b = nxt
            del nxt
        assert b is not None, "no batch of 20 was decoded in place from the link's heap"
        held = b.serialize().to_pybytes()
        assert transports(env) == {"shm"}
        assert shared_mappings() > mappings_before, "the consumer maps the link's region"
        p.kill()
        noticed = read_until_connection_lost(gate, tracker)
        assert noticed < DEATH_NOTICE, f"the consumer noticed the death after {noticed:.2f} s"
        s = tracker.stats()
        assert (s["duplicated"], s["out_of_order"], s["corrupted"]) == (0, 0, 0)
        # The batch still held (decoded in place from the link's heap) keeps the region
        # mapped and unchanged after the producer's death ...
        time.sleep(0.2)
        assert b.serialize().to_pybytes() == held
        assert shared_mappings() > mappings_before, "a held batch lost its memory"
        # ... and once it is dropped, the connection being gone, the mapping and the doorbell
        # socket are gone too.
        del b
        gc.collect()
        deadline = time.monotonic() + 5
        while shared_mappings() > mappings_before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert shared_mappings() == mappings_before
        gate.close()
    # The environment's own descriptors (its runtime's) go with the last handle to it.
    del gate, env
    gc.collect()
    deadline = time.monotonic() + 5
    while (new := fds().keys() - fds_before.keys()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not new, {fd: fds().get(fd) for fd in new}


# ------------------------------------------------------------------- a garbage peer over shm

RING_HEADER = 4096


def boot_id() -> bytes:
    with open("/proc/sys/kernel/random/boot_id") as f:
        return bytes.fromhex(f.read().strip().replace("-", ""))


def garbage_link(addr: str, garbage: bytes) -> bytes:
    """Sets up a shared-memory link to the environment at ``addr`` by hand (Hello with an
    offer, AuthProof, the Unix socket, the region's descriptor), writes ``garbage`` into the
    ring to the server and rings; returns what the doorbell socket gave until it closed."""
    import mmap
    import socket
    import struct

    from test_faults import AUTH_PROOF, HELLO, PROTOCOL_VERSION, frame

    host, port = addr.rsplit(":", 1)
    nonce = bytes(range(32))
    offer = struct.pack("<B16sIIQ", 1, boot_id(), os.getuid(), os.getpid(), 0)
    hello = struct.pack("<BIIB", PROTOCOL_VERSION, 32 * 1024, 32 * 1024 + 35, 0) + nonce + offer
    with socket.create_connection((host, int(port)), timeout=5) as tcp:
        tcp.sendall(frame(HELLO, hello))
        ack = tcp.recv(10 + 107, socket.MSG_WAITALL)
        assert ack[8:10] == bytes([PROTOCOL_VERSION, 2]), ack
        flag, _boot, _uid, pid, key = struct.unpack_from("<B16sIIQ", ack, 10 + 42)
        assert flag == 1, "the environment offers shared memory"
        tcp.sendall(frame(AUTH_PROOF, bytes(32)))
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as link:
            link.settimeout(5)
            link.connect(f"\0creditflow-shm-{pid}-{key:016x}")
            link.sendall(nonce)
            layout, fds, _, _ = socket.recv_fds(link, 24, 1)
            s2c, c2s, heap = struct.unpack("<QQQ", layout)
            (fd,) = fds
            size = 2 * RING_HEADER + s2c + c2s + (RING_HEADER + heap if heap else 0)
            with mmap.mmap(fd, size) as region:
                os.close(fd)
                ring = RING_HEADER + s2c  # client -> server
                region[ring + RING_HEADER : ring + RING_HEADER + len(garbage)] = garbage
                struct.pack_into("<Q", region, ring, len(garbage))
                link.sendall(b"\x01")
                got = b""
                try:
                    while chunk := link.recv(4096):
                        got += chunk
                except ConnectionResetError:
                    pass
                except TimeoutError:
                    pytest.fail("the environment kept the link open")
                return got


@pytest.mark.parametrize(
    "garbage", [b"\xff" * 64, b"\x0a\x00\x00\x00CFLW\x05\x63"], ids=["random", "bad type"]
)
def test_garbage_through_a_link_closes_it_and_the_environment_serves_on(garbage: bytes) -> None:
    with cf.NetworkEnvironment(memory="4MiB") as env:
        part = env.create_partition("p", 1)
        garbage_link(env.address, garbage)
        # The environment goes on serving a well-behaved peer over shared memory.
        with cf.NetworkEnvironment(memory="4MiB") as peer:
            gate = peer.create_input_gate([cf.ChannelSpec(env.address, "p", 0)])
            batches = [type_batch(i, ROWS) for i in range(5)]
            with cf.RecordWriter(part, cf.ForwardPartitioner(), timeout=10) as w:
                w.write(batches[0])
                first = gate.next(timeout=10)
                assert transports(peer) == {"shm"}
                for b in batches[1:]:
                    w.write(b)
            assert_batches_equal([first, *gate], batches)
