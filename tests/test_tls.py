"""TLS (issue 6): mutual TLS between processes delivers every batch exactly once and in order;
plaintext and TLS peers refuse each other with a clear error on both sides; and a plaintext
peer, a peer with a certificate from another CA and garbage are refused by a TLS listener
while a healthy TLS exchange on it completes.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

import pytest

import creditflow as cf
from remote_worker import Tracker, Worker, seq_partition
from test_faults import read_to_close
from tls_certs import make_tls, tls_kwargs

COUNT = 200


def read_until_error(gate: cf.InputGate) -> None:
    while gate.next(timeout=10) is not None:
        pass


@pytest.mark.parametrize(
    ("server_tls", "client_tls", "message"),
    [(True, False, "requires TLS"), (False, True, "did not answer in TLS")],
    ids=["plaintext client, TLS listener", "TLS client, plaintext listener"],
)
def test_plaintext_and_tls_peers_refuse_each_other_with_a_clear_error(
    tmp_path: Path, server_tls: bool, client_tls: bool, message: str
) -> None:
    tls = make_tls(tmp_path)
    with (
        cf.NetworkEnvironment(memory="1MiB", tls=tls if server_tls else None) as server,
        cf.NetworkEnvironment(memory="1MiB", tls=tls if client_tls else None) as client,
    ):
        server.create_partition("p", 1)
        gate = client.create_input_gate([cf.ChannelSpec(server.address, "p", 0)])
        with pytest.raises(cf.AuthenticationError, match=message):
            read_until_error(gate)


def test_bad_pem_files_are_a_clear_error(tmp_path: Path) -> None:
    tls = make_tls(tmp_path)
    missing = cf.TLSConfig(tls.cert, tmp_path / "missing.pem", tls.ca)
    with pytest.raises(cf.InvalidArgumentError, match=r"missing\.pem"):
        cf.NetworkEnvironment(tls=missing)


def test_mutual_tls_needs_no_secret_on_a_wildcard_bind(tmp_path: Path) -> None:
    with cf.NetworkEnvironment(memory="1MiB", bind="0.0.0.0:0", tls=make_tls(tmp_path)) as env:
        assert env.address
    with pytest.raises(ValueError, match="secret"):
        cf.NetworkEnvironment(bind="0.0.0.0:0", tls=make_tls(tmp_path, "one-way", client_auth=False))


def test_tls_listener_refuses_strangers_while_a_tls_exchange_completes(
    tmp_path: Path, workers: list[Worker]
) -> None:
    tls = make_tls(tmp_path)
    env = {"memory": "1MiB", "tls": tls_kwargs(tls), "handshake_timeout": 2.0}
    workers.append(p := Worker("producer", env=env, partitions=[seq_partition(COUNT, 1024)]))
    addr = p.wait_for("address")["address"]
    tracker = Tracker()
    with cf.NetworkEnvironment(memory="1MiB", tls=tls) as consumer:
        gate = consumer.create_input_gate([cf.ChannelSpec(addr, "p", 0)])
        for _ in range(10):
            b = gate.next(timeout=10)
            assert b is not None
            tracker.add(b)
        # A plaintext environment: refused, and told why.
        with cf.NetworkEnvironment(memory="1MiB") as plain:
            g = plain.create_input_gate([cf.ChannelSpec(addr, "p", 0)])
            with pytest.raises(cf.AuthenticationError, match="requires TLS"):
                read_until_error(g)
        # A TLS environment whose certificate another CA signed: the handshake fails.
        with cf.NetworkEnvironment(memory="1MiB", tls=make_tls(tmp_path, "stranger")) as stranger:
            g = stranger.create_input_gate([cf.ChannelSpec(addr, "p", 0)])
            with pytest.raises(cf.AuthenticationError, match="TLS handshake"):
                read_until_error(g)
        # Garbage that starts like a TLS record, then nothing: closed.
        host, port = addr.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(bytes([22, 3, 1]) + random.Random(3).randbytes(40))
            read_to_close(s)
        while (b := gate.next(timeout=10)) is not None:
            tracker.add(b)
    stats = tracker.stats()
    assert (stats["unique"], stats["duplicated"], stats["out_of_order"], stats["corrupted"]) == (
        {"0/0": COUNT},
        0,
        0,
        0,
    )
    assert p.wait_for("finished")["batches"] == COUNT
