"""Two network namespaces joined by a veth pair, each with its own address: two "hosts" on
one machine (``tests/test_netns.py``, ``scripts/soak_netns.py``, ``scripts/netns_table.py``).
:func:`wire` adds a second link between them, through a userspace relay that delays and drops
packets (``tests/wire.py``), for kernels without ``sch_netem``. Needs root and iproute2."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from wire import check_impairment


class Unavailable(RuntimeError):
    """Namespaces cannot be made here; the message says why."""


def ip(*args: str) -> None:
    """Runs ``ip ARGS``; raises ``CalledProcessError`` (with stderr) on failure."""
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@dataclass
class Hosts:
    """Namespaces ``a`` and ``b`` joined by veth ``dev_a`` (in a, ``addr_a``) / ``dev_b`` (in b)."""

    a: str
    b: str
    addr_a: str
    addr_b: str
    dev_a: str
    dev_b: str
    tag: str

    def tc(self, ns: str, dev: str, *args: str) -> subprocess.CompletedProcess[str]:
        """Replaces the root qdisc of ``dev`` in ``ns`` (``tc qdisc replace ... root ARGS``)."""
        return subprocess.run(
            ["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", *args],
            capture_output=True,
            text=True,
        )

    def link(self, up: bool) -> None:
        """Cuts (``up=False``) or restores the link: a's end of the veth goes down or up."""
        ip("-n", self.a, "link", "set", self.dev_a, "up" if up else "down")


def require_namespaces() -> None:
    """Raises :class:`Unavailable` with the reason unless this process may make namespaces
    (root, iproute2's ``ip`` and ``tc``)."""
    if os.geteuid() != 0:
        raise Unavailable("network namespaces need root")
    if shutil.which("ip") is None or shutil.which("tc") is None:
        raise Unavailable("iproute2 (ip, tc) is not installed")


@contextlib.contextmanager
def namespaces(tag: str) -> Iterator[Hosts]:
    """Creates the two namespaces (names from ``tag``, at most 11 characters) and removes
    them on exit, whatever happened. Raises :class:`Unavailable` with the reason if it cannot."""
    require_namespaces()
    subnet = f"10.213.{os.getpid() % 250}"
    h = Hosts(f"{tag}a", f"{tag}b", f"{subnet}.1", f"{subnet}.2", f"{tag}va", f"{tag}vb", tag)
    try:
        ip("netns", "add", h.a)
    except subprocess.CalledProcessError as exc:
        raise Unavailable(f"the kernel refuses network namespaces: {exc.stderr.strip()}") from exc
    try:
        ip("netns", "add", h.b)
        ip("link", "add", h.dev_a, "netns", h.a, "type", "veth", "peer", "name", h.dev_b, "netns", h.b)
        for ns, dev, addr in ((h.a, h.dev_a, h.addr_a), (h.b, h.dev_b, h.addr_b)):
            ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            ip("-n", ns, "link", "set", dev, "up")
            ip("-n", ns, "link", "set", "lo", "up")
        yield h
    finally:
        for ns in (h.a, h.b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@dataclass
class Wire:
    """A point-to-point link from ``addr_a`` (TUN ``dev_a`` in namespace a) to ``addr_b``
    (``dev_b`` in b), its own subnet beside the veth's, through the relay process ``proc``
    (``tests/wire.py``): every packet, both ways, is dropped with probability ``loss`` or
    delivered ``delay`` seconds later, in order."""

    addr_a: str
    addr_b: str
    dev_a: str
    dev_b: str
    ns_a: str
    proc: subprocess.Popen[str]
    stderr: TextIO

    def link(self, up: bool) -> None:
        """Cuts (``up=False``) or restores the wire: ``dev_a`` goes down or up, as
        :meth:`Hosts.link` does to the veth (the relay counts what it cannot deliver as
        ``send_failed``)."""
        ip("-n", self.ns_a, "link", "set", self.dev_a, "up" if up else "down")

    def _ask(self, key: str, **cmd: Any) -> Any:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # the relay is gone; the read below says why
        line = self.proc.stdout.readline()
        if not line:
            self.stderr.seek(0)
            raise RuntimeError(f"the wire relay exited; its stderr:\n{self.stderr.read()[-4000:]}")
        msg = json.loads(line)
        if "error" in msg:
            raise ValueError(f"the wire relay refused {cmd}: {msg['error']}")
        return msg[key]

    def set(self, delay: float = 0.0, loss: float = 0.0) -> None:
        """From the next packet on, both directions: ``delay`` seconds, ``loss`` probability
        (``ValueError`` if out of range)."""
        check_impairment(delay, loss)
        self._ask("set", cmd="set", delay=delay, loss=loss)

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per direction (``"a>b"``, ``"b>a"``): packets received, dropped (loss), overflow
        (queue full), sent, send_failed; bytes_sent; queued; delay; loss."""
        stats: dict[str, dict[str, Any]] = self._ask("stats", cmd="stats")
        return stats


@contextlib.contextmanager
def wire(h: Hosts, delay: float = 0.0, loss: float = 0.0, seed: int = 1) -> Iterator[Wire]:
    """Joins ``h``'s namespaces by a second link through a userspace relay (``tests/wire.py``)
    with ``delay`` seconds and ``loss`` probability both ways (changeable with
    :meth:`Wire.set`), the loss drawn from ``seed``. The relay runs in this process's
    namespace; its TUN devices move into ``h``'s namespaces and vanish when it exits, which
    it does on leaving the block, whatever happened."""
    check_impairment(delay, loss)
    subnet = f"10.214.{os.getpid() % 250}"
    stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed in the finally below)
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("wire.py")), "relay", f"{h.tag}ta", f"{h.tag}tb"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        env={**os.environ, "WIRE_SEED": str(seed)},
    )
    w = Wire(f"{subnet}.1", f"{subnet}.2", f"{h.tag}ta", f"{h.tag}tb", h.a, proc, stderr)
    try:
        assert proc.stdout is not None
        if not proc.stdout.readline():
            proc.wait(5)
            stderr.seek(0)
            raise Unavailable(f"the wire relay could not start (TUN devices): {stderr.read()[-2000:]}")
        for ns, dev, addr, peer in ((h.a, w.dev_a, w.addr_a, w.addr_b), (h.b, w.dev_b, w.addr_b, w.addr_a)):
            ip("link", "set", "dev", dev, "netns", ns)
            ip("-n", ns, "link", "set", "dev", dev, "addrgenmode", "none")  # no IPv6 chatter
            ip("-n", ns, "addr", "add", addr, "peer", peer, "dev", dev)
            ip("-n", ns, "link", "set", "dev", dev, "up")
        w.set(delay, loss)
        yield w
    finally:
        assert proc.stdin is not None
        with contextlib.suppress(OSError):
            proc.stdin.close()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        stderr.close()
