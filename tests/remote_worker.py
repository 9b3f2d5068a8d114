"""Worker processes of the transport tests (``tests/test_remote.py``, ``tests/test_faults.py``)
and of the soak (``scripts/soak.py``), the parent-side :class:`Worker` that starts and drives
them, and the data both sides agree on.

A worker is a separate OS process, ``python tests/remote_worker.py ROLE CONFIG_JSON``. It talks
to its parent in JSON lines: it prints one object per line on stdout and reads one object per
line on stdin. Its stderr goes to a file the parent shows when the worker fails. Times that
cross processes are ``time.monotonic()`` (``CLOCK_MONOTONIC``: one clock for the machine).

Roles:

The harness (messages, :class:`Worker`) is ``tests/workers.py``.

``producer``  one NetworkEnvironment (``env``: its settings) with the partitions in
              ``partitions`` (each: ``id``, ``subpartitions``, ``partitioner``, ``data``,
              ``count``, ``rows``, ``delay``), one writer thread each. Prints ``{"address"}``
              at once; a partition is created ``delay`` seconds later, gets ``count`` batches
              (``None``: until "stop") and is closed, then ``{"finished": id, "sent": {...}}``.
              Commands: ``{"cmd": "metrics"}`` → ``{"metrics": env.metrics()}``;
              ``{"cmd": "stop"}`` ends endless writers; ``{"cmd": "exit"}`` (or end of stdin)
              closes the environment and exits.
``consumer``  one NetworkEnvironment with the gates in ``gates`` (each a list of
              ``[address, partition, subpartition]``), one reader thread each, checking
              ``data="seq"`` (or ``"lineitem"``) batches with a :class:`Tracker`.
              ``pause_after``: a reader stops reading for good after that many batches (and
              prints ``{"paused": gate}``);
              ``random_stalls``: ``{"seed", "every", "longest"}`` seconds. Commands:
              ``{"cmd": "stall", "gate": g, "seconds": s}`` (gate g stops reading after its
              next batch), ``{"cmd": "report"}``. Prints ``{"done": [per-gate stats]}`` at
              the end of every gate, then exits.

Any failure of a worker thread is printed as ``{"error": ..., "where": ...}``.

Data kinds (made the same way in every process, from the batch number ``i``):

``types``  :func:`type_batch`: a hash key ``k``, the global row number ``row``, and strings,
           nulls, a nested list of structs, a dictionary, a decimal and a timestamp column.
``seq``    :func:`seq_batch`: ``producer``, ``channel``, ``seq``, a payload and a
           ``checksum`` over it. Written round robin, so batch ``i`` of a partition with ``n``
           subpartitions goes to channel ``i % n`` as its ``seq = i // n``.
``lineitem``  :func:`lineitem_batch`: the columns of TPC-H's ``lineitem`` table (keys, prices,
           dates, flags, ship modes, comment text; float64 for its decimals), plus ``seq``'s
           ``producer``, ``channel``, ``seq`` and ``checksum`` (over ``l_partkey``), so a
           :class:`Tracker` checks it the same way. Compressible as real tables are, unlike
           ``seq``, whose columns are constant but for 20 random bits in each 64-bit payload.
"""

from __future__ import annotations

import functools
import json
import os
import random
import sys
import threading
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

import creditflow as cf
from workers import Config, commands, emit, environment, guarded, partitioner
from workers import Worker as _Worker

#: Any single wait of a worker or of its parent.
TIMEOUT = 60.0
SEED = 23


# ------------------------------------------------------------------------------------- data


def type_batch(i: int, rows: int) -> pa.RecordBatch:
    """Batch ``i`` of the ``types`` data: rows ``i * rows`` to ``(i + 1) * rows - 1``."""
    rng = random.Random(SEED * 1000 + i)
    first = i * rows
    nested: list[list[dict[str, Any]] | None] = []
    for r in range(rows):
        if r % 11 == 3:
            nested.append(None)
        else:
            nested.append([{"a": rng.randrange(-1000, 1000), "b": None if r % 7 == 0 else f"n{r}"}] * (r % 4))
    colors = ["red", "green", "blue", "grün", ""]
    fields = {
        "k": pa.array(
            [None if r % 97 == 5 else rng.randrange(-(2**40), 2**40) for r in range(rows)], pa.int64()
        ),
        "row": pa.array(range(first, first + rows), pa.int64()),
        "s": pa.array([None if r % 5 == 0 else "x" * (r % 13) + str(first + r) for r in range(rows)]),
        "f": pa.array([None if r % 3 == 0 else rng.random() for r in range(rows)], pa.float64()),
        "nested": pa.array(nested, pa.list_(pa.struct([("a", pa.int32()), ("b", pa.string())]))),
        "dict": pa.DictionaryArray.from_arrays(
            pa.array([None if r % 9 == 0 else rng.randrange(len(colors)) for r in range(rows)], pa.int8()),
            pa.array(colors),
        ),
        "dec": pa.array(
            [
                None if r % 8 == 1 else Decimal(rng.randrange(-(10**18), 10**18)).scaleb(-4)
                for r in range(rows)
            ],
            pa.decimal128(20, 4),
        ),
        "ts": pa.array([first + r * 1_000_003 for r in range(rows)], pa.timestamp("us", tz="Europe/Berlin")),
    }
    schema = pa.schema(
        [pa.field(n, a.type) for n, a in fields.items()], metadata={"made-by": "remote_worker"}
    )
    return pa.RecordBatch.from_arrays(list(fields.values()), schema=schema)


def _checksum(payload: np.ndarray) -> int:
    # Order-sensitive, exact in int64: payload values < 2**20, positions < 2**17, rows < 2**17.
    return int((payload * np.arange(1, len(payload) + 1, dtype=np.int64)).sum())


def seq_batch(producer: int, i: int, num_channels: int, rows: int) -> pa.RecordBatch:
    """Batch ``i`` of producer ``producer``'s ``seq`` data (``rows`` varies a little with ``i``)."""
    channel, seq = i % num_channels, i // num_channels
    n = max(1, rows - (i * 7919) % max(1, rows // 2))
    rng = np.random.default_rng([SEED, producer, channel, seq])
    payload = rng.integers(0, 1 << 20, n, dtype=np.int64)
    return pa.record_batch(
        {
            "producer": pa.array(np.full(n, producer, np.int32)),
            "channel": pa.array(np.full(n, channel, np.int32)),
            "seq": pa.array(np.full(n, seq, np.int64)),
            "payload": pa.array(payload),
            "checksum": pa.array(np.full(n, _checksum(payload), np.int64)),
        }
    )


#: Words of TPC-H's comment grammar (nouns, verbs, adverbs, prepositions).
_WORD_TEXT = (
    "furiously carefully slyly quickly blithely ironic final regular express pending bold "
    "special unusual even silent fluffy busy ruthless packages deposits requests accounts "
    "instructions theodolites pinto beans foxes ideas dependencies excuses platelets asymptotes "
    "courts dolphins multipliers sauternes warthogs frets dinos attainments somas Tiresias "
    "patterns forges braids hockey players frays warhorses dugouts notornis epitaphs pearls "
    "tithes waters orbits gifts sheaves depths sentiments decoys realms pains grouches "
    "escapades haggle sleep wake are cajole nag use boost affix detect integrate maintain nod "
    "was lose sublate solve thrash promise engage hinder print x-ray breach eat grow impress "
    "mold poach serve run dazzle snooze doze unwind kindle play hang believe doubt about above "
    "according to across after against along of among around at atop before behind beneath "
    "beside between beyond by despite during except for from in inside instead into near on "
    "outside over past since through toward under until upon without with within the"
)
_WORDS = _WORD_TEXT.split()
_SHIP_MODES = ["REG AIR", "AIR", "RAIL", "SHIP", "TRUCK", "MAIL", "FOB"]
_INSTRUCTIONS = ["DELIVER IN PERSON", "COLLECT COD", "NONE", "TAKE BACK RETURN"]
#: Distinct lineitem tables :func:`lineitem_batch` cycles through (made once per process).
LINEITEM_VARIANTS = 8


def _comments(rng: np.random.Generator, rows: int) -> pa.Array:
    """``rows`` comments of 10 to 43 characters: slices of a text of random words."""
    text = np.frombuffer(
        " ".join(_WORDS[w] for w in rng.integers(0, len(_WORDS), 8 * rows)).encode(), np.uint8
    )
    lengths = rng.integers(10, 44, rows)
    starts = rng.integers(0, len(text) - 44, rows)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    within = np.arange(offsets[-1]) - np.repeat(offsets[:-1], lengths)
    data = text[np.repeat(starts, lengths) + within]
    return pa.StringArray.from_buffers(rows, pa.py_buffer(offsets), pa.py_buffer(data.tobytes()))


@functools.lru_cache(maxsize=2 * LINEITEM_VARIANTS)
def _lineitem_columns(variant: int, rows: int) -> tuple[dict[str, pa.Array], int]:
    """TPC-H-like ``lineitem`` columns of ``rows`` rows, and the checksum of ``l_partkey``."""
    rng = np.random.default_rng([SEED, 71, variant])
    per_order = rng.integers(1, 8, rows)
    order = np.repeat(np.arange(rows), per_order)[:rows]
    line = np.concatenate([np.arange(1, k + 1) for k in per_order])[:rows]
    partkey = rng.integers(1, 200_001, rows)
    retail = (90_000 + (partkey // 10) % 20_001 + 100 * (partkey % 1_000)) / 100
    quantity = rng.integers(1, 51, rows).astype(np.float64)
    ship = 8_036 + rng.integers(0, 2_526, rows)  # 1992-01-02 onwards, as days since 1970
    flags, instructions, modes = (
        np.array(c, dtype=object) for c in (["R", "A", "N"], _INSTRUCTIONS, _SHIP_MODES)
    )
    columns = {
        "l_orderkey": pa.array((variant * rows + order) * 4 + 1, pa.int64()),
        "l_partkey": pa.array(partkey, pa.int64()),
        "l_suppkey": pa.array(rng.integers(1, 10_001, rows), pa.int64()),
        "l_linenumber": pa.array(line, pa.int32()),
        "l_quantity": pa.array(quantity),
        "l_extendedprice": pa.array(np.round(quantity * retail, 2)),
        "l_discount": pa.array(rng.integers(0, 11, rows) / 100),
        "l_tax": pa.array(rng.integers(0, 9, rows) / 100),
        "l_returnflag": pa.array(flags[rng.integers(0, 3, rows)].tolist(), pa.string()),
        "l_linestatus": pa.array(np.where(ship > 9_298, "O", "F").tolist(), pa.string()),
        "l_shipdate": pa.array(ship.astype(np.int32), pa.date32()),
        "l_commitdate": pa.array((ship + rng.integers(-60, 61, rows)).astype(np.int32), pa.date32()),
        "l_receiptdate": pa.array((ship + rng.integers(1, 31, rows)).astype(np.int32), pa.date32()),
        "l_shipinstruct": pa.array(instructions[rng.integers(0, 4, rows)].tolist(), pa.string()),
        "l_shipmode": pa.array(modes[rng.integers(0, 7, rows)].tolist(), pa.string()),
        "l_comment": _comments(rng, rows),
    }
    return columns, _checksum(partkey)


def lineitem_batch(producer: int, i: int, num_channels: int, rows: int) -> pa.RecordBatch:
    """Batch ``i`` of producer ``producer``'s ``lineitem`` data: one of
    :data:`LINEITEM_VARIANTS` tables with ``seq``'s bookkeeping columns in front."""
    channel, seq = i % num_channels, i // num_channels
    columns, checksum = _lineitem_columns(i % LINEITEM_VARIANTS, rows)
    n = rows
    return pa.record_batch(
        {
            "producer": pa.array(np.full(n, producer, np.int32)),
            "channel": pa.array(np.full(n, channel, np.int32)),
            "seq": pa.array(np.full(n, seq, np.int64)),
            "checksum": pa.array(np.full(n, checksum, np.int64)),
            **columns,
        }
    )


#: The data kinds a :class:`Tracker` checks.
TRACKED = ("seq", "lineitem")


def make_batch(data: str, i: int, *, producer: int, num_channels: int, rows: int) -> pa.RecordBatch:
    if data == "types":
        return type_batch(i, rows)
    if data == "seq":
        return seq_batch(producer, i, num_channels, rows)
    if data == "lineitem":
        return lineitem_batch(producer, i, num_channels, rows)
    raise ValueError(f"unknown data {data!r}")


class Tracker:
    """Checks ``seq`` batches: per (producer, channel), counts what arrived, duplicates, what
    came after a later one (out of order) and corrupted batches. Lost batches are what the
    producer sent minus :meth:`unique`. Memory grows with the gaps, not with the stream."""

    def __init__(self) -> None:
        self.high: dict[tuple[int, int], int] = {}  # highest seq seen
        self.missing: dict[tuple[int, int], set[int]] = {}  # seqs under it not seen yet
        self.batches = 0
        self.rows = 0
        self.duplicated = 0
        self.out_of_order = 0
        self.corrupted = 0

    def add(self, b: pa.RecordBatch) -> None:
        key = (b.column("producer")[0].as_py(), b.column("channel")[0].as_py())
        seq = b.column("seq")[0].as_py()
        self.batches += 1
        self.rows += b.num_rows
        checked = b.column("payload" if "payload" in b.schema.names else "l_partkey")
        if b.column("checksum")[0].as_py() != _checksum(checked.to_numpy()):
            self.corrupted += 1
        high = self.high.get(key, -1)
        missing = self.missing.setdefault(key, set())
        if seq > high:
            missing.update(range(high + 1, seq))
            self.high[key] = seq
        elif seq in missing:
            missing.remove(seq)
            self.out_of_order += 1
        else:
            self.duplicated += 1

    def unique(self) -> dict[str, int]:
        """Distinct batches received per ``"producer/channel"`` (seqs start at 0)."""
        return {f"{p}/{c}": high + 1 - len(self.missing[p, c]) for (p, c), high in self.high.items()}

    def stats(self) -> Config:
        return {
            "batches": self.batches,
            "rows": self.rows,
            "unique": self.unique(),
            "duplicated": self.duplicated,
            "out_of_order": self.out_of_order,
            "corrupted": self.corrupted,
        }


def seq_partition(count: int | None, rows: int, partition_id: str = "p", data: str = "seq") -> Config:
    """A producer's partition spec: one subpartition of ``seq`` data (or another kind
    :class:`Tracker` checks), ``count`` batches (``None``: until "stop") of about ``rows`` rows."""
    return {
        "id": partition_id,
        "subpartitions": 1,
        "partitioner": "forward",
        "data": data,
        "count": count,
        "rows": rows,
    }


def soak_partitions(rows: int, partitions: int = 4, channels: int = 4) -> list[Config]:
    """The producer side of the soaks' exchange (``scripts/soak.py``, ``scripts/soak_netns.py``):
    ``partitions`` partitions ``soak/0``, ``soak/1``... (producer numbers 0, 1...) of
    ``channels`` subpartitions each, ``seq`` data of about ``rows`` rows written round robin
    until "stop"."""
    return [
        {
            "id": f"soak/{p}",
            "producer": p,
            "subpartitions": channels,
            "partitioner": "round_robin",
            "data": "seq",
            "count": None,
            "rows": rows,
        }
        for p in range(partitions)
    ]


def soak_gates(address: str, partitions: int = 4, channels: int = 4) -> list[list[list[Any]]]:
    """The consumer side of :func:`soak_partitions` served at ``address``: gate ``c`` reads
    subpartition ``c`` of every partition (``partitions`` x ``channels`` channels)."""
    return [[[address, f"soak/{p}", c] for p in range(partitions)] for c in range(channels)]


def vm_rss_kib(pid: int | str = "self") -> int:
    """Resident set size of a process, in KiB (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


# ------------------------------------------------------------------------------ worker side


def producer(cfg: Config) -> None:
    stop = threading.Event()
    with environment(cfg["env"]) as env:
        emit(address=env.address, pid=os.getpid())

        def writer(spec: Config) -> Callable[[], None]:
            def run() -> None:
                time.sleep(spec.get("delay", 0.0))
                part = env.create_partition(spec["id"], spec["subpartitions"])
                count = spec.get("count")
                sent: dict[str, int] = {}
                i = 0
                with cf.RecordWriter(part, partitioner(spec["partitioner"]), timeout=TIMEOUT) as w:
                    while (i < count) if count is not None else not stop.is_set():
                        b = make_batch(
                            spec["data"],
                            i,
                            producer=spec.get("producer", 0),
                            num_channels=spec["subpartitions"],
                            rows=spec.get("rows", 1000),
                        )
                        w.write(b)
                        key = f"{spec.get('producer', 0)}/{i % spec['subpartitions']}"
                        sent[key] = sent.get(key, 0) + 1
                        i += 1
                emit(finished=spec["id"], batches=i, sent=sent)

            return run

        for spec in cfg["partitions"]:
            threading.Thread(target=guarded(spec["id"], writer(spec)), daemon=True).start()
        for cmd in commands():
            if cmd["cmd"] == "metrics":
                emit(metrics=env.metrics())
            elif cmd["cmd"] == "stop":
                stop.set()
            elif cmd["cmd"] == "exit":
                break


def consumer(cfg: Config) -> None:
    with environment(cfg["env"]) as env:
        gates = [
            env.create_input_gate([cf.ChannelSpec(a, p, s) for a, p, s in chans]) for chans in cfg["gates"]
        ]
        trackers = [Tracker() for _ in gates]
        times: list[list[float]] = [[] for _ in gates]
        stalls: list[list[tuple[float, float]]] = [[] for _ in gates]
        stall_for = [0.0 for _ in gates]
        pause_after = cfg.get("pause_after")
        random_stalls = cfg.get("random_stalls")
        emit(address=env.address, pid=os.getpid())

        def stall(g: int, seconds: float) -> None:
            t0 = time.monotonic()
            time.sleep(seconds)
            stalls[g].append((t0, time.monotonic()))

        def reader(g: int) -> Callable[[], None]:
            def run() -> None:
                rng = random.Random(f"{(random_stalls or {}).get('seed', 0)}/{g}")
                next_stall = (
                    time.monotonic() + rng.uniform(0, 2 * random_stalls["every"]) if random_stalls else 0.0
                )
                while (b := gates[g].next(timeout=TIMEOUT)) is not None:
                    if cfg.get("times"):
                        times[g].append(time.monotonic())
                    if cfg.get("data") in TRACKED:
                        trackers[g].add(b)
                    else:
                        trackers[g].batches += 1
                        trackers[g].rows += b.num_rows
                    if pause_after is not None and trackers[g].batches >= pause_after:
                        emit(paused=g)
                        threading.Event().wait()  # reads no more, ever
                    if stall_for[g]:
                        seconds, stall_for[g] = stall_for[g], 0.0
                        stall(g, seconds)
                    if random_stalls and time.monotonic() >= next_stall:
                        stall(g, rng.uniform(0, random_stalls["longest"]))
                        next_stall = time.monotonic() + rng.uniform(0, 2 * random_stalls["every"])
                gates[g].close()

            return run

        def control() -> None:
            for cmd in commands():
                if cmd["cmd"] == "stall":
                    stall_for[cmd["gate"]] = cmd["seconds"]
                elif cmd["cmd"] == "report":
                    emit(report=[t.batches for t in trackers])

        threading.Thread(target=control, daemon=True).start()
        threads = [
            threading.Thread(target=guarded(f"gate {g}", reader(g)), daemon=True) for g in range(len(gates))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        emit(
            done=[{**tr.stats(), "times": times[g], "stalls": stalls[g]} for g, tr in enumerate(trackers)],
            metrics=env.metrics(),
        )


ROLES: dict[str, Callable[[Config], None]] = {"producer": producer, "consumer": consumer}


# ------------------------------------------------------------------------------ parent side


class Worker(_Worker):
    """A worker process of this script (see the roles above)."""

    script = Path(__file__).resolve()
    timeout = TIMEOUT


def wait_all_segments_free(metrics: Callable[[], Config], what: str, timeout: float = 5.0) -> None:
    """Polls ``metrics()`` (an environment's) until every segment is available again."""
    deadline = time.monotonic() + timeout
    while True:
        m = metrics()
        if m["segments_available"] == m["segments_total"]:
            return
        assert time.monotonic() < deadline, f"{what}: segments not returned: {m}"
        time.sleep(0.05)


def main(argv: list[str]) -> None:
    if len(argv) != 3 or argv[1] not in ROLES:
        raise SystemExit(f"usage: {argv[0]} {{{','.join(ROLES)}}} CONFIG_JSON")
    ROLES[argv[1]](json.loads(argv[2]))


if __name__ == "__main__":
    main(sys.argv)
