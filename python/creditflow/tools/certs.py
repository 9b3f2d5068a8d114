"""Certificates for TLS between environments: a CA and a certificate per node it signed
(``creditflow certs``). Needs ``pip install 'creditflow[tls]'`` (the ``cryptography`` package).

:func:`make_certs` writes into one directory:

- ``ca.pem`` and ``ca-key.pem``: the CA (made on the first call, reused by later ones, so
  nodes can be added);
- for each node, ``NAME.pem`` and ``NAME-key.pem``: a certificate for its hosts (DNS names
  and IP addresses, as subjectAltNames) with both ``serverAuth`` and ``clientAuth``, signed
  by the CA.

Keys are written with mode 0600. Existing node files are not overwritten unless
``force=True``. Every node then uses
``TLSConfig(cert="DIR/NAME.pem", key="DIR/NAME-key.pem", ca="DIR/ca.pem")``.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.asymmetric.types import CertificateIssuerPrivateKeyTypes

__all__ = ["CertsError", "Node", "NodeFiles", "make_certs", "parse_node"]

CA_CERT = "ca.pem"
CA_KEY = "ca-key.pem"


class CertsError(Exception):
    """A request :func:`make_certs` refuses (files in the way, a bad host name)."""


@dataclass(frozen=True)
class Node:
    """A node to make a certificate for: its file name stem and its hosts (DNS names or IP
    addresses; the first is also its common name)."""

    name: str
    hosts: tuple[str, ...]


@dataclass(frozen=True)
class NodeFiles:
    """The files of one node's TLS, as :class:`creditflow.TLSConfig` takes them."""

    name: str
    cert: Path
    key: Path
    ca: Path


_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_LABEL = r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_DNS = re.compile(rf"^(\*\.)?({_LABEL}\.)*{_LABEL}$")


def parse_node(spec: str) -> Node:
    """A node from ``HOST[,HOST...]`` or ``NAME=HOST[,HOST...]``; without a name, the first
    host names the files (other characters than letters, digits, ``.``, ``_`` and ``-`` becoming
    ``-``, ``*`` ``wildcard``)."""
    name, sep, hosts_part = spec.partition("=")
    if not sep:
        name, hosts_part = "", spec
    hosts = tuple(h.strip() for h in hosts_part.split(",") if h.strip())
    if not hosts:
        raise CertsError(f"{spec!r}: no host (give HOST[,HOST...] or NAME=HOST[,HOST...])")
    for h in hosts:
        _check_host(h)
    name = name.strip() or re.sub(r"[^A-Za-z0-9._-]+", "-", hosts[0].replace("*", "wildcard")).strip("-._")
    if not _NAME.match(name):
        raise CertsError(f"{name!r} is not a usable file name (letters, digits, '.', '_', '-')")
    return Node(name, hosts)


def _check_host(host: str) -> None:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not _DNS.match(host) or len(host) > 253:
            raise CertsError(f"{host!r} is neither an IP address nor a DNS name") from None


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _san(hosts: Sequence[str]) -> x509.SubjectAlternativeName:
    from cryptography import x509

    names: list[x509.GeneralName] = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    return x509.SubjectAlternativeName(names)


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    from cryptography import x509

    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _write(path: Path, data: bytes, mode: int, *, overwrite: bool) -> None:
    """Writes ``data`` to ``path`` with permissions ``mode`` (also when the file existed)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if overwrite else os.O_EXCL)
    fd = os.open(path, flags, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, data)
    finally:
        os.close(fd)


def _load_or_make_ca(
    out: Path, ca_days: int, now: datetime.datetime
) -> tuple[x509.Certificate, CertificateIssuerPrivateKeyTypes, bool]:
    """The CA in ``out`` (made there if neither of its files exists); whether it was made."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
    from cryptography.x509.oid import NameOID

    cert_path, key_path = out / CA_CERT, out / CA_KEY
    if cert_path.exists() and key_path.exists():
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        if not isinstance(
            key,
            (ec.EllipticCurvePrivateKey, rsa.RSAPrivateKey, ed25519.Ed25519PrivateKey, ed448.Ed448PrivateKey),
        ):
            raise CertsError(f"{key_path}: not a key a CA can sign with")
        if cert.public_key() != key.public_key():
            raise CertsError(f"{key_path} is not the key of {cert_path}")
        return cert, key, False
    if cert_path.exists() or key_path.exists():
        have, missing = (cert_path, key_path) if cert_path.exists() else (key_path, cert_path)
        raise CertsError(f"{have} exists but {missing} does not: remove it, or give another --out")
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"creditflow CA {now:%Y-%m-%d %H:%M:%S}")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=ca_days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write(key_path, _pem_key(key), 0o600, overwrite=False)
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644, overwrite=False)
    return cert, key, True


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def make_certs(
    out: str | os.PathLike[str],
    nodes: Sequence[Node | str],
    *,
    days: int = 825,
    ca_days: int = 3650,
    force: bool = False,
) -> tuple[list[NodeFiles], bool]:
    """Writes a certificate and key per node into ``out``, signed by the CA there (made
    first if ``out`` has none). ``nodes``: :class:`Node` or ``[NAME=]HOST[,HOST...]``.
    Node certificates are valid ``days`` days, a new CA ``ca_days``. Refuses (with
    :class:`CertsError`, before writing anything) when a node's files exist, unless
    ``force``. Returns the files of each node and whether the CA was made now."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if days < 1 or ca_days < 1:
        raise CertsError("days and ca_days must be at least 1")
    parsed = [n if isinstance(n, Node) else parse_node(n) for n in nodes]
    if not parsed:
        raise CertsError("no node given")
    names = [n.name for n in parsed]
    if len(set(names)) != len(names):
        raise CertsError(f"two nodes have the same name: {sorted(names)}")
    if any(n in ("ca", "ca-key") for n in names):
        raise CertsError("'ca' names the CA's files; give the node another NAME=")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if not force:
        existing = [
            str(p) for n in parsed for p in (out / f"{n.name}.pem", out / f"{n.name}-key.pem") if p.exists()
        ]
        if existing:
            verb = "exists" if len(existing) == 1 else "exist"
            raise CertsError(f"{', '.join(existing)} already {verb}: give --force to overwrite")
    now = _utcnow()
    ca_cert, ca_key, made = _load_or_make_ca(out, ca_days, now)
    aki = x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key())
    # Ed25519 and Ed448 sign without a separate digest.
    eddsa = isinstance(ca_key, (ed25519.Ed25519PrivateKey, ed448.Ed448PrivateKey))
    digest = None if eddsa else hashes.SHA256()
    result = []
    for node in parsed:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node.hosts[0])]))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(min(now + datetime.timedelta(days=days), ca_cert.not_valid_after_utc))
            .add_extension(_san(node.hosts), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(ca=False), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(aki, critical=False)
            .sign(ca_key, digest)
        )
        files = NodeFiles(node.name, out / f"{node.name}.pem", out / f"{node.name}-key.pem", out / CA_CERT)
        _write(files.key, _pem_key(key), 0o600, overwrite=force)
        _write(files.cert, cert.public_bytes(serialization.Encoding.PEM), 0o644, overwrite=force)
        result.append(files)
    return result, made
