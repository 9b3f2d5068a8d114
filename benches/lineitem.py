"""Deterministic TPC-H-like ``lineitem`` batches in numpy and pyarrow, for benchmarks of data
shaped like real tables (decimals, dates, flags, free text).

The rules are dbgen's at scale factor 1: 1-7 lines an order, sparse order keys, the supplier
derived from the part, the extended price from the part's retail price, ship, commit and
receipt dates from the order date, return flag and line status from the dates, and comments
that are random pieces of a text pool built from dbgen's grammar and vocabulary.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# Scale factor 1: parts and suppliers; the dates bounding the data and "today".
PARTS = 200_000
SUPPLIERS = 10_000
START = (datetime.date(1992, 1, 1) - datetime.date(1970, 1, 1)).days
END = (datetime.date(1998, 12, 31) - datetime.date(1970, 1, 1)).days
CURRENT = (datetime.date(1995, 6, 17) - datetime.date(1970, 1, 1)).days
INSTRUCTIONS = ["DELIVER IN PERSON", "COLLECT COD", "NONE", "TAKE BACK RETURN"]
MODES = ["REG AIR", "AIR", "RAIL", "SHIP", "TRUCK", "MAIL", "FOB"]

# The vocabulary of dbgen's text grammar (part of each word list; "_" joins a two-word entry).
NOUNS = """foxes ideas theodolites pinto_beans instructions dependencies excuses platelets asymptotes
courts dolphins multipliers sauternes warthogs frets dinos attainments somas Tiresias patterns forges
braids hockey_players frays warhorses dugouts notornis epitaphs pearls tithes waters orbits gifts
sheaves depths sentiments decoys realms pains grouches escapades packages requests accounts deposits"""
VERBS = """sleep wake are cajole haggle nag use boost affix detect integrate maintain nod was lose
sublate solve thrash promise engage hinder print x-ray breach eat grow impress mold poach serve run
dazzle snooze doze unwind kindle play hang believe doubt"""
ADJECTIVES = """furious sly careful blithe quick fluffy slow quiet ruthless thin close dogged daring
brave stealthy permanent enticing idle busy regular final ironic even bold silent pending express
special unusual"""
ADVERBS = """sometimes always never furiously slyly carefully blithely quickly fluffily slowly quietly
ruthlessly thinly closely doggedly daringly bravely stealthily permanently enticingly idly busily
regularly finally ironically evenly boldly silently"""
PREPOSITIONS = """about above according_to across after against along alongside_of among around at
atop before behind beneath beside besides between beyond by despite during except for from
in_place_of inside instead_of into near of on outside over past since through throughout to toward
under until up upon without with within"""
TERMINATORS = [". ", "; ", ": ", "? ", "! ", " -- "]


def _words(text: str) -> np.ndarray:
    return np.array([w.replace("_", " ") for w in text.split()])


def text_pool(rng: np.random.Generator, size: int) -> bytes:
    """``size`` bytes of dbgen-like text: sentences "[adjective] noun verb [adverb]
    preposition the adjective noun" and a terminator, words drawn uniformly."""
    nouns, verbs, adjs, advs, preps = map(_words, (NOUNS, VERBS, ADJECTIVES, ADVERBS, PREPOSITIONS))
    n = size // 40 + 1

    def pick(words: np.ndarray, keep: float = 1.0) -> np.ndarray:
        chosen = np.char.add(words[rng.integers(0, len(words), n)], " ")
        return np.where(rng.random(n) < keep, chosen, "")

    sentence = pick(adjs, 0.5)
    for part in (pick(nouns), pick(verbs), pick(advs, 0.5), pick(preps), np.full(n, "the "), pick(adjs)):
        sentence = np.char.add(sentence, part)
    sentence = np.char.add(sentence, nouns[rng.integers(0, len(nouns), n)])
    sentence = np.char.add(sentence, np.array(TERMINATORS)[rng.integers(0, len(TERMINATORS), n)])
    return "".join(sentence.tolist()).encode()[:size]


def _decimal(cents: np.ndarray) -> pa.Array:
    """decimal(12,2) from non-negative int64 hundredths (128-bit little-endian values)."""
    words = np.zeros((len(cents), 2), dtype=np.int64)
    words[:, 0] = cents
    return pa.Array.from_buffers(pa.decimal128(12, 2), len(cents), [None, pa.py_buffer(words.tobytes())])


def _strings(choices: Sequence[str], idx: np.ndarray) -> pa.Array:
    return pc.take(pa.array(choices, pa.string()), pa.array(idx))


def _substrings(pool: bytes, starts: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """utf8 array of pool[start:start+length] per row (dbgen's comments: a random piece of
    its text pool)."""
    offsets = np.zeros(len(starts) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    index = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])
    data = np.frombuffer(pool, dtype=np.uint8)[index]
    return pa.Array.from_buffers(
        pa.string(), len(starts), [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(data.tobytes())]
    )


def lineitem(
    rng: np.random.Generator, first_order: int, rows: int, text: bytes
) -> tuple[pa.RecordBatch, int]:
    """``rows`` lineitem rows of consecutive orders from order number ``first_order`` (dbgen's
    rules at scale factor 1: 1-7 lines an order, sparse order keys, supplier from part,
    extended price from the part's retail price, dates from the order date, flags from the
    dates, text comments of 10-43 characters); returns the batch and the next order number."""
    lines = rng.integers(1, 8, rows)  # at least one line per order: enough orders for `rows`
    n_orders = int(np.searchsorted(np.cumsum(lines), rows)) + 1
    lines = lines[:n_orders]
    order = first_order + np.repeat(np.arange(n_orders), lines)[:rows]
    linenumber = (np.arange(rows) - np.repeat(np.cumsum(lines) - lines, lines)[:rows] + 1).astype(np.int32)
    orderkey = (order // 8) * 32 + order % 8 + 1  # dbgen: 8 of every 32 keys used
    orderdate = rng.integers(START, END - 151 + 1, n_orders)[order - first_order]
    partkey = rng.integers(1, PARTS + 1, rows)
    i = rng.integers(0, 4, rows)
    suppkey = (partkey + i * (SUPPLIERS // 4 + (partkey - 1) // SUPPLIERS)) % SUPPLIERS + 1
    quantity = rng.integers(1, 51, rows)
    retail_cents = 90_000 + (partkey // 10) % 20_001 + 100 * (partkey % 1_000)
    shipdate = orderdate + rng.integers(1, 122, rows)
    commitdate = orderdate + rng.integers(30, 91, rows)
    receiptdate = shipdate + rng.integers(1, 31, rows)
    returnflag = np.where(receiptdate <= CURRENT, rng.integers(0, 2, rows), 2)  # R, A or N
    linestatus = (shipdate <= CURRENT).astype(np.int64)  # O or F
    length = rng.integers(10, 44, rows)
    batch = pa.record_batch(
        {
            "l_orderkey": pa.array(orderkey, pa.int64()),
            "l_partkey": pa.array(partkey.astype(np.int32)),
            "l_suppkey": pa.array(suppkey.astype(np.int32)),
            "l_linenumber": pa.array(linenumber),
            "l_quantity": _decimal(quantity * 100),
            "l_extendedprice": _decimal(quantity * retail_cents),
            "l_discount": _decimal(rng.integers(0, 11, rows)),
            "l_tax": _decimal(rng.integers(0, 9, rows)),
            "l_returnflag": _strings(["R", "A", "N"], returnflag),
            "l_linestatus": _strings(["O", "F"], linestatus),
            "l_shipdate": pa.array(shipdate.astype(np.int32)).view(pa.date32()),
            "l_commitdate": pa.array(commitdate.astype(np.int32)).view(pa.date32()),
            "l_receiptdate": pa.array(receiptdate.astype(np.int32)).view(pa.date32()),
            "l_shipinstruct": _strings(INSTRUCTIONS, rng.integers(0, len(INSTRUCTIONS), rows)),
            "l_shipmode": _strings(MODES, rng.integers(0, len(MODES), rows)),
            "l_comment": _substrings(text, rng.integers(0, len(text) - 43, rows), length),
        }
    )
    return batch, int(order[-1]) + 1


def batches(seed: int, count: int, rows: int, text_bytes: int = 16 << 20) -> list[pa.RecordBatch]:
    """``count`` consecutive batches of ``rows`` rows (one table cut into batches), from a
    text pool of ``text_bytes`` (dbgen's is 300 MB; a batch draws about 27 bytes a row)."""
    rng = np.random.default_rng(seed)
    text = text_pool(rng, text_bytes)
    out, order = [], 0
    for _ in range(count):
        b, order = lineitem(rng, order, rows, text)
        out.append(b)
    return out


def check(pool: Sequence[pa.RecordBatch]) -> None:
    """The generated rows keep dbgen's relations (so the compression figures are about data
    shaped like TPC-H's): keys ascending, line numbers per order, dates, flags and lengths."""
    t = pa.Table.from_batches(pool)
    keys = t.column("l_orderkey").to_numpy()
    assert (np.diff(keys) >= 0).all()
    assert ((keys - 1) % 32 < 8).all()
    assert pc.max(t.column("l_linenumber")).as_py() == 7
    ship = t.column("l_shipdate").cast(pa.int32()).to_numpy()
    receipt = t.column("l_receiptdate").cast(pa.int32()).to_numpy()
    assert (receipt > ship).all()
    assert (receipt - ship <= 30).all()
    flag = np.array(t.column("l_returnflag").to_pylist())
    assert set(flag[receipt > CURRENT]) == {"N"}
    assert set(flag[receipt <= CURRENT]) == {"R", "A"}
    status = np.array(t.column("l_linestatus").to_pylist())
    assert set(status[ship > CURRENT]) == {"O"}
    assert set(status[ship <= CURRENT]) == {"F"}
    lengths = pc.utf8_length(t.column("l_comment")).to_numpy()
    assert lengths.min() == 10
    assert lengths.max() == 43
    assert 0.9 < pc.mean(t.column("l_discount").cast(pa.float64())).as_py() / 0.05 < 1.1
