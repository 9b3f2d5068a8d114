"""Two network namespaces joined by a veth pair, each with its own address: two "hosts" on
one machine (``tests/test_netns.py``, ``scripts/soak_netns.py``). Needs root and iproute2."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass


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


@contextlib.contextmanager
def namespaces(tag: str) -> Iterator[Hosts]:
    """Creates the two namespaces (names from ``tag``, at most 11 characters) and removes
    them on exit, whatever happened. Raises :class:`Unavailable` with the reason if it cannot."""
    if os.geteuid() != 0:
        raise Unavailable("network namespaces need root")
    if shutil.which("ip") is None or shutil.which("tc") is None:
        raise Unavailable("iproute2 (ip, tc) is not installed")
    subnet = f"10.213.{os.getpid() % 250}"
    h = Hosts(f"{tag}a", f"{tag}b", f"{subnet}.1", f"{subnet}.2", f"{tag}va", f"{tag}vb")
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
