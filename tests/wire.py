"""A userspace "wire" between two TUN devices that delays and drops packets: ``tc netem``'s
delay and loss for kernels without ``sch_netem`` (``tests/test_netns.py``,
``scripts/soak_netns.py``, ``scripts/netns_table.py``).

The relay (``python tests/wire.py relay DEV_A DEV_B``, run by :func:`netns.wire` as root)
creates two TUN devices (IP packets, no packet-info header) and copies every packet read from
one to the other. Each direction is a :class:`Link`: a packet is dropped with probability
``loss`` (a seeded ``random.Random``, like netem's ``loss random``), otherwise held for
``delay`` seconds in a FIFO (constant delay: never reordered) of at most ``limit`` packets
(netem's default 1000; beyond it the packet is dropped and counted as ``overflow``). The
parent moves the devices into the namespaces and gives them addresses; the devices vanish
with the relay's file descriptors, so a killed relay leaves nothing behind.

It talks to its parent in JSON lines, like ``remote_worker``: it prints ``{"ready": true}``
once the devices exist; commands on stdin: ``{"cmd": "set", "delay": s, "loss": p}`` (both
directions, from the next packet on) → ``{"set": {...}}``; ``{"cmd": "stats"}`` →
``{"stats": {"a>b": {...}, "b>a": {...}}}`` (:meth:`Link.stats`); end of stdin exits.
"""

from __future__ import annotations

import collections
import errno
import fcntl
import json
import os
import random
import select
import struct
import sys
import time
from typing import Any

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
#: Largest packet a TUN device hands us (its MTU can be at most 65535).
MAX_PACKET = 65536
#: Packets read from one device before the relay looks at the other and at the clock.
READ_BURST = 64


def check_impairment(delay: float, loss: float) -> None:
    """Raises ``ValueError`` unless ``delay`` is seconds >= 0 and ``loss`` a probability in [0, 1]."""
    if not delay >= 0.0:  # also refuses NaN
        raise ValueError(f"delay must be >= 0 seconds, got {delay!r}")
    if not 0.0 <= loss <= 1.0:
        raise ValueError(f"loss must be a probability in [0, 1], got {loss!r}")


class Link:
    """One direction of the wire: the loss decision and the delay line, on an explicit clock
    (``now`` arguments, seconds) so it can be tested without devices."""

    def __init__(self, *, delay: float = 0.0, loss: float = 0.0, limit: int = 1000, seed: int = 0) -> None:
        self.limit = limit
        self.rng = random.Random(seed)
        self.queue: collections.deque[tuple[float, bytes]] = collections.deque()
        self.counts = {"received": 0, "dropped": 0, "overflow": 0, "sent": 0, "send_failed": 0}
        self.bytes_sent = 0
        self.delay = 0.0
        self.loss = 0.0
        self.configure(delay=delay, loss=loss)

    def configure(self, *, delay: float, loss: float) -> None:
        """Sets the delay and the loss probability for the packets that arrive from now on
        (:func:`check_impairment`)."""
        check_impairment(delay, loss)
        self.delay, self.loss = delay, loss

    def push(self, packet: bytes, now: float) -> None:
        """A packet entered the wire at ``now``: dropped, or queued until ``now + delay``."""
        self.counts["received"] += 1
        if self.loss and self.rng.random() < self.loss:
            self.counts["dropped"] += 1
        elif len(self.queue) >= self.limit:
            self.counts["overflow"] += 1
        else:
            # A smaller delay set while packets wait must not overtake them: FIFO, due times
            # never decrease.
            due = now + self.delay
            if self.queue and self.queue[-1][0] > due:
                due = self.queue[-1][0]
            self.queue.append((due, packet))

    def due(self, now: float) -> list[bytes]:
        """Removes and returns, in arrival order, the packets whose time has come."""
        out = []
        while self.queue and self.queue[0][0] <= now:
            out.append(self.queue.popleft()[1])
        return out

    def next_due(self) -> float | None:
        """When the oldest queued packet is due, or ``None`` if none is queued."""
        return self.queue[0][0] if self.queue else None

    def stats(self) -> dict[str, Any]:
        """Packet counts (received, dropped by loss, overflow, sent, send_failed), bytes sent,
        packets queued now, and the current delay and loss."""
        return {
            **self.counts,
            "bytes_sent": self.bytes_sent,
            "queued": len(self.queue),
            "delay": self.delay,
            "loss": self.loss,
        }


def open_tun(name: str) -> int:
    """Creates TUN device ``name`` (IP packets, no packet-info header); its non-blocking fd."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    except OSError:
        os.close(fd)
        raise
    return fd


def _emit(**fields: Any) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def relay(dev_a: str, dev_b: str) -> None:
    """Runs the wire between new TUN devices ``dev_a`` and ``dev_b`` until stdin closes."""
    fds = {"a": open_tun(dev_a), "b": open_tun(dev_b)}
    seed = int(os.environ.get("WIRE_SEED", "1"))
    links = {"a>b": Link(seed=seed), "b>a": Link(seed=seed + 1)}
    route = {fds["a"]: (links["a>b"], fds["b"]), fds["b"]: (links["b>a"], fds["a"])}
    out_fd = {"a>b": fds["b"], "b>a": fds["a"]}
    control = sys.stdin.fileno()
    pending = b""
    _emit(ready=True)
    while True:
        dues = [t for t in (link.next_due() for link in links.values()) if t is not None]
        timeout = max(0.0, min(dues) - time.monotonic()) if dues else None
        readable, _, _ = select.select([*route, control], [], [], timeout)
        for fd in readable:
            if fd == control:
                chunk = os.read(control, 65536)
                if not chunk:
                    return
                pending += chunk
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    if line.strip():
                        _command(json.loads(line), links)
                continue
            link, _ = route[fd]
            for _ in range(READ_BURST):
                try:
                    packet = os.read(fd, MAX_PACKET)
                except BlockingIOError:
                    break
                link.push(packet, time.monotonic())
        now = time.monotonic()
        for name, link in links.items():
            for packet in link.due(now):
                try:
                    os.write(out_fd[name], packet)
                except OSError as exc:  # the far device is down (a cut): the packet is lost
                    if exc.errno not in (errno.EIO, errno.EAGAIN, errno.ENOBUFS, errno.EINVAL):
                        raise
                    link.counts["send_failed"] += 1
                else:
                    link.counts["sent"] += 1
                    link.bytes_sent += len(packet)


def _command(cmd: dict[str, Any], links: dict[str, Link]) -> None:
    """Runs one parent command; a bad one is answered with ``{"error"}`` and changes nothing."""
    try:
        if cmd.get("cmd") == "set":
            delay, loss = float(cmd["delay"]), float(cmd["loss"])
            check_impairment(delay, loss)
            for link in links.values():
                link.configure(delay=delay, loss=loss)
            _emit(set={"delay": delay, "loss": loss})
        elif cmd.get("cmd") == "stats":
            _emit(stats={name: link.stats() for name, link in links.items()})
        else:
            raise ValueError(f"unknown wire command {cmd!r}")
    except (KeyError, TypeError, ValueError) as exc:
        _emit(error=f"{type(exc).__name__}: {exc}")


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] != "relay":
        raise SystemExit(f"usage: {sys.argv[0]} relay DEV_A DEV_B")
    relay(sys.argv[2], sys.argv[3])
