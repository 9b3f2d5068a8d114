"""Writes seed inputs for the frame_decoder fuzz target into corpus/frame_decoder/: streams
of valid frames of every message type (so libFuzzer starts from inputs that get past the
header checks), under each mode and a few chunkings. Run once; the fuzzer minimizes and
extends the corpus from there. Layout of an input: see creditflow_core::fuzz::frames."""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

PROTOCOL_VERSION = 2  # creditflow_core::protocol::wire::PROTOCOL_VERSION


def frame(msg_type: int, body: bytes) -> bytes:
    return struct.pack("<I4sBB", 10 + len(body), b"CFLW", PROTOCOL_VERSION, msg_type) + body


def string(s: bytes) -> bytes:
    return struct.pack("<I", len(s)) + s


HELLO = struct.pack("<BIIB", PROTOCOL_VERSION, 4096, 4096 + 35, 1) + bytes(range(32))
MESSAGES = [
    frame(1, HELLO),
    frame(2, HELLO + bytes(32)),
    frame(3, bytes(32)),
    frame(4, struct.pack("<QII", 1, 0, 2) + string(b"job/stage/0")),
    frame(5, struct.pack("<QI", 1, 3)),
    frame(6, struct.pack("<QI", 1, 5)),
    frame(7, struct.pack("<QQIBI", 1, 0, 2, 0, 100) + bytes(range(100))),
    frame(7, struct.pack("<QQIBI", 1, 1, 0, 1, 1) + b"\x00"),
    frame(7, struct.pack("<QQIBI", 1, 2, 0, 1, 8) + b"\x01" + string(b"bad")),
    frame(8, struct.pack("<BQH", 0, 0, 2) + string(b"protocol")),
    frame(8, struct.pack("<BQH", 1, 4, 7) + string(b"limit")),
    frame(9, struct.pack("<Q", 1)),
    frame(10, b""),
    frame(11, struct.pack("<Q", 2)),
]


def main() -> None:
    out = Path(__file__).parent / "corpus" / "frame_decoder"
    out.mkdir(parents=True, exist_ok=True)
    stream = b"".join(MESSAGES)
    big = frame(7, struct.pack("<QQIBI", 9, 0, 0, 0, 4096) + bytes(4096))
    for mode in range(8):
        for sizes in ([1], [7, 3], [4096], [35, 1, 100]):
            prefix = bytes([mode, len(sizes) - 1]) + b"".join(struct.pack("<H", s) for s in sizes)
            for body in (stream, big + stream[:200]):
                data = prefix + body
                (out / hashlib.sha1(data).hexdigest()).write_bytes(data)


if __name__ == "__main__":
    main()
