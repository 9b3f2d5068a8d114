"""TLS: mutual TLS between processes delivers every batch exactly once and in order;
plaintext and TLS peers refuse each other with a clear error on both sides; and a plaintext
peer, a peer with a certificate from another CA and garbage are refused by a TLS listener
while a healthy TLS exchange on it completes.

Everyday certificates: the self-signed certificate of ``openssl req -x509`` given
as cert and ca on both sides works; so do the files ``creditflow certs`` writes; and a
certificate the peer does not trust is refused with a message naming the file, without
rustls's debug formatting.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import creditflow as cf
from remote_worker import Tracker, Worker, seq_partition
from test_faults import read_to_close
from tls_certs import make_tls, openssl_self_signed, tls_kwargs

COUNT = 200


@pytest.fixture(autouse=True)
def over_tcp(transport: str) -> None:
    """Every test here runs over TCP, where TLS records carry the frames: between environments
    of one host they would otherwise move to shared memory after the TLS handshake."""
    assert transport == "tcp"


pytestmark = pytest.mark.parametrize("transport", ["tcp"], indirect=True)


def check_all_arrived(tracker: Tracker, producer: Worker) -> None:
    """The ``COUNT`` batches ``producer`` wrote each arrived once, in order, intact."""
    stats = tracker.stats()
    assert (stats["unique"], stats["duplicated"], stats["out_of_order"], stats["corrupted"]) == (
        {"0/0": COUNT},
        0,
        0,
        0,
    )
    assert producer.wait_for("finished")["batches"] == COUNT


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
    check_all_arrived(tracker, p)


def exchange(workers: list[Worker], producer_tls: cf.TLSConfig, consumer_tls: cf.TLSConfig) -> None:
    """``COUNT`` batches from a producer process with ``producer_tls`` to an environment here
    with ``consumer_tls``: every one arrives once, in order."""
    env = {"memory": "1MiB", "tls": tls_kwargs(producer_tls)}
    workers.append(p := Worker("producer", env=env, partitions=[seq_partition(COUNT, 256)]))
    addr = p.wait_for("address")["address"]
    tracker = Tracker()
    with cf.NetworkEnvironment(memory="1MiB", tls=consumer_tls) as consumer:
        gate = consumer.create_input_gate([cf.ChannelSpec(addr, "p", 0)])
        while (b := gate.next(timeout=10)) is not None:
            tracker.add(b)
    check_all_arrived(tracker, p)


def refusal(server_tls: cf.TLSConfig, client_tls: cf.TLSConfig) -> str:
    """The message of the error a client with ``client_tls`` gets from a server with
    ``server_tls``."""
    with (
        cf.NetworkEnvironment(memory="1MiB", tls=server_tls) as server,
        cf.NetworkEnvironment(memory="1MiB", tls=client_tls) as client,
    ):
        server.create_partition("p", 1)
        gate = client.create_input_gate([cf.ChannelSpec(server.address, "p", 0)])
        with pytest.raises(cf.AuthenticationError) as refused:
            read_until_error(gate)
    return str(refused.value)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command on PATH")
def test_the_everyday_openssl_self_signed_certificate_works_as_cert_and_ca_on_both_sides(
    tmp_path: Path, workers: list[Worker]
) -> None:
    tls = openssl_self_signed(tmp_path)
    assert (tls.cert.name, tls.key.name, tls.ca.name) == ("c.pem", "k.pem", "c.pem")
    exchange(workers, tls, tls)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command on PATH")
def test_a_certificate_not_in_ca_is_refused_naming_the_file_in_plain_words(tmp_path: Path) -> None:
    mine, theirs = openssl_self_signed(tmp_path / "mine"), openssl_self_signed(tmp_path / "theirs")
    # The client does not know the server's certificate.
    message = refusal(mine, theirs)
    assert f"ca={theirs.ca}" in message, message
    assert "the certificate of the server at 127.0.0.1:" in message, message
    assert "Fix: " in message, message
    for debug in ("OtherError", "Other(", "InvalidCertificate", "CaUsedAsEndEntity"):
        assert debug not in message, message
    # The server does not know the client's: the client is told that the server refused its
    # certificate, naming its cert file.
    both = tmp_path / "both.pem"
    both.write_bytes(theirs.cert.read_bytes() + mine.cert.read_bytes())
    message = refusal(mine, cf.TLSConfig(theirs.cert, theirs.key, both))
    assert f"refused this environment's certificate (cert={theirs.cert})" in message, message
    assert "OtherError" not in message, message


def creditflow(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """``python -m creditflow ARGS`` as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "creditflow", *map(str, args)], capture_output=True, text=True, timeout=60
    )


def test_creditflow_certs_writes_files_a_two_node_exchange_works_with(
    tmp_path: Path, workers: list[Worker]
) -> None:
    out = tmp_path / "pki"
    run = creditflow("certs", "--out", out, "a=localhost,127.0.0.1", "b=127.0.0.1,::1")
    assert run.returncode == 0, run.stderr
    assert "wrote the CA" in run.stdout
    files = {p.name for p in out.iterdir()}
    assert files == {"ca.pem", "ca-key.pem", "a.pem", "a-key.pem", "b.pem", "b-key.pem"}
    for key in ("ca-key.pem", "a-key.pem", "b-key.pem"):
        assert stat.S_IMODE(os.stat(out / key).st_mode) == 0o600, key
    node = {n: cf.TLSConfig(out / f"{n}.pem", out / f"{n}-key.pem", out / "ca.pem") for n in "ab"}
    exchange(workers, node["a"], node["b"])
    # Not overwritten without --force; a new node is signed by the same CA.
    before = (out / "a.pem").read_bytes()
    run = creditflow("certs", "--out", out, "a=127.0.0.1")
    assert run.returncode == 1
    assert "already exist" in run.stderr
    assert "--force" in run.stderr
    assert (out / "a.pem").read_bytes() == before
    run = creditflow("certs", "--out", out, "--force", "a=127.0.0.1", "c=localhost,127.0.0.1")
    assert run.returncode == 0, run.stderr
    assert "signed with the existing CA" in run.stdout
    assert (out / "a.pem").read_bytes() != before
    assert stat.S_IMODE(os.stat(out / "c-key.pem").st_mode) == 0o600
    node_c = cf.TLSConfig(out / "c.pem", out / "c-key.pem", out / "ca.pem")
    exchange(workers, node_c, node["b"])


def test_creditflow_certs_refuses_bad_hosts_and_a_lone_ca_file(tmp_path: Path) -> None:
    run = creditflow("certs", "--out", tmp_path, "a=not a host")
    assert run.returncode == 1
    assert "neither an IP address nor a DNS name" in run.stderr
    (tmp_path / "ca.pem").write_text("")
    run = creditflow("certs", "--out", tmp_path, "localhost")
    assert run.returncode == 1
    assert "ca-key.pem does not" in run.stderr
