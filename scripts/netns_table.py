#!/usr/bin/env python3
"""The impairment throughput table (``make netns-table``; root; not part of ``make test``).

One producer in network namespace a, one consumer in namespace b, one channel of ``seq``
batches (about 4,096 rows, 32 bytes a row: the data of ``tests/test_netns.py``), the producer
writing as fast as it can for ``--seconds``; then it stops and the consumer reads to the end.
Every run checks that every batch arrived exactly once, in order, uncorrupted. Throughput is
payload bytes (the batches' Arrow size, before any compression) over the time from the first
to the last batch received. Impairments:

- the veth unimpaired, and under a ``tc tbf`` 100 Mbit/s cap on both ends;
- both again with ``lineitem`` batches (4,096 rows of TPC-H's lineitem columns, about 160 bytes
  a row, ``tests/remote_worker.py``), uncompressed and with the producer's
  ``wire_compression`` ``"lz4"`` and ``"zstd"`` (``seq`` batches are nearly all constant
  columns and compress far better than real tables; the script prints the IPC size ratio of
  both kinds);
- the userspace wire (``tests/wire.py``; this kernel has no ``sch_netem``) unimpaired (the
  relay's own ceiling), with 20 ms delay, with 1% loss, and with both, each way;
- 20 ms delay again with more credit: a gate can have at most its credit (exclusive plus
  floating segments) in flight, so under delay its throughput is bounded by credit over the
  round trip;
- a 5 s cut of the veth (``ip link set down``) ``--cut-after`` seconds into the run, once with
  ``peer_timeout`` above the cut (the exchange survives; the producer writes on for half of
  ``--seconds`` after the link is back; the table gives the throughput over the whole run,
  cut included, and the longest gap between two batches) and once with ``peer_timeout`` 2 s,
  below it (the gate must fail with ``ConnectionLostError``; the table gives when).

Runs are interleaved (every impairment once, then again) so a change of load on this shared
machine hits all of them alike; the table gives the median and the range of ``--repeat`` runs.

    python scripts/netns_table.py --repeat 3 --seconds 8
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import pyarrow as pa

from netns import Hosts, Unavailable, Wire, namespaces, wire
from remote_worker import Worker, make_batch, seq_partition

ROWS = 4096
SECRET = "netns-table"
CUT = 5.0
SHORT_TIMEOUT = 2.0


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--repeat", type=int, default=3, help="runs of each impairment (default 3)")
    p.add_argument("--seconds", type=float, default=8.0, help="how long the producer writes (default 8)")
    p.add_argument(
        "--cut-after", type=float, default=2.0, help="seconds into a run the cut starts (default 2)"
    )
    p.add_argument("--only", default="", help="run only the rows whose name contains this")
    return p.parse_args(argv)


@dataclass
class Row:
    """One impairment: how to set it up before a run, and what each run measured."""

    name: str
    link: str
    setup: Callable[[], None]
    cut: bool = False
    peer_timeout: float = 30.0
    consumer: dict[str, object] = field(default_factory=dict)  # extra consumer settings
    producer: dict[str, object] = field(default_factory=dict)  # extra producer settings
    data: str = "seq"
    rates: list[float] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)
    failed_after: list[float] = field(default_factory=list)
    batches: list[int] = field(default_factory=list)
    packets: list[int] = field(default_factory=list)  # wire: packets that entered it, both ways
    dropped: list[int] = field(default_factory=list)  # wire: dropped by loss or a full queue


def env(bind: str, peer_timeout: float, **more: object) -> dict[str, object]:
    return {"memory": "4MiB", "bind": bind, "secret": SECRET, "peer_timeout": peer_timeout, **more}


def wire_counts(w: Wire) -> tuple[int, int]:
    """Packets that entered the wire, and those it dropped (loss or full queue), both ways."""
    s = w.stats().values()
    return sum(d["received"] for d in s), sum(d["dropped"] + d["overflow"] for d in s)


def sample(data: str) -> list[pa.RecordBatch]:
    """The first batches of ``data`` a producer writes."""
    return [make_batch(data, i, producer=0, num_channels=1, rows=ROWS) for i in range(16)]


def bytes_per_row(data: str) -> float:
    """The Arrow bytes of a row of ``data``, averaged over :func:`sample`."""
    batches = sample(data)
    nbytes: int = sum(b.nbytes for b in batches)
    rows: int = sum(b.num_rows for b in batches)
    return nbytes / rows


def ipc_ratio(data: str, codec: str) -> float:
    """Uncompressed over compressed Arrow IPC stream size of :func:`sample` (pyarrow with the
    codecs arrow-rs uses: LZ4 frame, ZSTD level 3)."""

    def size(compression: pa.Codec | None) -> int:
        sink = pa.BufferOutputStream()
        batches = sample(data)
        options = pa.ipc.IpcWriteOptions(compression=compression)
        with pa.ipc.new_stream(sink, batches[0].schema, options=options) as w:
            for b in batches:
                w.write_batch(b)
        return int(sink.getvalue().size)

    level = 3 if codec == "zstd" else None
    return size(None) / size(pa.Codec(codec, compression_level=level))


def run(h: Hosts, w: Wire, row: Row, args: argparse.Namespace) -> None:
    """One run of ``row``; appends its figures to the row, raises on any loss or reordering."""
    row.setup()
    before = wire_counts(w)
    via = w.addr_a if row.link == "wire" else h.addr_a
    part = [seq_partition(None, ROWS, data=row.data)]
    p_env = env(f"{via}:0", row.peer_timeout, **row.producer)
    with Worker("producer", netns=h.a, env=p_env, partitions=part) as p:
        addr = p.wait_for("address")["address"]
        gates = [[[addr, "p", 0]]]
        c_env = env("127.0.0.1:0", row.peer_timeout, **row.consumer)
        with Worker("consumer", netns=h.b, env=c_env, gates=gates, data=row.data, times=True) as c:
            c.wait_for("address")
            end = time.monotonic() + args.seconds
            if row.cut:
                time.sleep(args.cut_after)
                h.link(up=False)
                cut_at = time.monotonic()
                try:
                    if row.peer_timeout < CUT:
                        c.wait_for("error", timeout=CUT + 30)
                        row.failed_after.append(time.monotonic() - cut_at)
                        return
                finally:
                    time.sleep(max(0.0, cut_at + CUT - time.monotonic()))
                    h.link(up=True)
                end = max(end, time.monotonic() + args.seconds / 2)  # and time to recover
            time.sleep(max(0.0, end - time.monotonic()))
            p.send(cmd="stop")
            sent = p.wait_for("finished", timeout=120)["batches"]
            done = c.wait_for("done", timeout=120)["done"][0]
            p.send(cmd="exit")
    got = (done["unique"], done["duplicated"], done["out_of_order"], done["corrupted"])
    if got != ({"0/0": sent}, 0, 0, 0):
        raise AssertionError(f"{row.name}: sent {sent}, got (unique, dup, out of order, corrupt) {got}")
    times = done["times"]
    row.rates.append(done["rows"] * bytes_per_row(row.data) / (times[-1] - times[0]) / 1e6)
    row.gaps.append(max(b - a for a, b in zip(times, times[1:], strict=False)))
    row.batches.append(sent)
    if row.link == "wire":
        after = wire_counts(w)
        row.packets.append(after[0] - before[0])
        row.dropped.append(after[1] - before[1])


def qdiscs(h: Hosts, *qdisc: str) -> None:
    """Sets root qdisc ``qdisc`` on both ends of the veth, or back to the default if none."""
    for ns, dev in ((h.a, h.dev_a), (h.b, h.dev_b)):
        if qdisc:
            r = h.tc(ns, dev, *qdisc)
            if r.returncode != 0:
                raise RuntimeError(f"tc {qdisc}: {r.stderr.strip()}")
        else:  # fails harmlessly when the default is in place already
            subprocess.run(
                ["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root"], capture_output=True
            )


def spread(xs: list[float], unit: str, digits: int = 1) -> str:
    if not xs:
        return "—"
    med = f"{statistics.median(xs):.{digits}f} {unit}"
    return med if len(xs) == 1 else f"{med} ({min(xs):.{digits}f}–{max(xs):.{digits}f})"


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    try:
        with namespaces(f"ct{os.getpid() % 100000}") as h, wire(h) as w:

            def veth(*qdisc: str) -> Callable[[], None]:
                """The veth with root qdisc ``qdisc`` on both ends (none: the default)."""

                def apply() -> None:
                    w.set(0.0, 0.0)
                    qdiscs(h, *qdisc)

                return apply

            def impaired(delay: float, loss: float) -> Callable[[], None]:
                def apply() -> None:
                    qdiscs(h)
                    w.set(delay, loss)

                return apply

            cap = veth("tbf", "rate", "100mbit", "burst", "64kb", "latency", "50ms")
            rows = [
                Row("unimpaired", "veth", veth()),
                Row("100 Mbit/s cap (`tc tbf`)", "veth", cap),
                *(
                    Row(
                        f"{name}, lineitem"
                        + (f', `wire_compression="{codec}"`' if codec else ", uncompressed"),
                        "veth",
                        setup,
                        data="lineitem",
                        producer={"wire_compression": codec} if codec else {},
                    )
                    for name, setup in (("unimpaired", veth()), ("100 Mbit/s cap (`tc tbf`)", cap))
                    for codec in (None, "lz4", "zstd")
                ),
                Row("unimpaired (the relay's ceiling)", "wire", impaired(0.0, 0.0)),
                Row("20 ms delay each way", "wire", impaired(0.020, 0.0)),
                Row(
                    "20 ms delay each way, credit 66 segments (`floating_buffers=64`)",
                    "wire",
                    impaired(0.020, 0.0),
                    consumer={"memory": "16MiB", "floating_buffers": 64},
                ),
                Row("1% loss each way", "wire", impaired(0.0, 0.01)),
                Row("20 ms delay + 1% loss each way", "wire", impaired(0.020, 0.01)),
                Row(f"{CUT:g} s cut, `peer_timeout` 30 s", "veth", veth(), cut=True),
                Row(
                    f"{CUT:g} s cut, `peer_timeout` {SHORT_TIMEOUT:g} s",
                    "veth",
                    veth(),
                    cut=True,
                    peer_timeout=SHORT_TIMEOUT,
                ),
            ]
            rows = [r for r in rows if args.only in r.name]
            for i in range(args.repeat):
                for row in rows:
                    run(h, w, row, args)
                    last = f"{row.rates[-1]:.1f} MB/s" if not row.failed_after else "failed"
                    print(f"run {i + 1}/{args.repeat}: {row.name} over {row.link}: {last}", flush=True)
            packets = w.stats()
    except Unavailable as exc:
        print(f"netns-table: skipped: {exc}")
        return 0
    except subprocess.CalledProcessError as exc:
        print(f"netns-table: {exc}: {exc.stderr}")
        return 1
    print(f"\n{args.repeat} runs each, {args.seconds:g} s of writing; median (min–max)\n")
    print("| impairment | link | throughput | longest gap between batches | result |")
    print("|---|---|---|---|---|")
    for row in rows:
        if row.failed_after:
            result = f"the gate failed with `ConnectionLostError` after {spread(row.failed_after, 's')}"
            print(f"| {row.name} | {row.link} | — | — | {result} |")
        else:
            result = f"every batch once, in order ({min(row.batches):,}–{max(row.batches):,} batches a run)"
            if row.packets:
                share = sum(row.dropped) / max(1, sum(row.packets))
                result += f"; the wire dropped {share:.2%} of {sum(row.packets):,} packets"
            rate, gap = spread(row.rates, "MB/s"), spread(row.gaps, "s", 2)
            print(f"| {row.name} | {row.link} | {rate} | {gap} | {result} |")
    print(f"\nwire packets over all runs: {packets}")
    for data in ("seq", "lineitem"):
        ratios = ", ".join(f"{c} {ipc_ratio(data, c):.2f}x" for c in ("lz4", "zstd"))
        print(f"IPC size ratio of {data} batches ({bytes_per_row(data):.0f} bytes a row): {ratios}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
