"""Test certificates for TLS (``cryptography``): a CA and a certificate it signed for
``localhost``, ``127.0.0.1`` and any other addresses asked for, written as PEM files; and the
self-signed certificate most guides make with the ``openssl`` command."""

from __future__ import annotations

import datetime
import ipaddress
import subprocess
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

import creditflow as cf


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def make_tls(
    directory: Path, name: str = "test", *, client_auth: bool = True, addresses: Sequence[str] = ()
) -> cf.TLSConfig:
    """A fresh CA and a leaf certificate it signed, as ``directory/name-{ca,cert,key}.pem``,
    in a :class:`cf.TLSConfig`; the leaf is valid for ``localhost``, ``127.0.0.1`` and the IP
    ``addresses`` (every peer presents the same one)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    valid = (now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=1))
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name(f"{name} CA"))
        .issuer_name(_name(f"{name} CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    ips = dict.fromkeys(["127.0.0.1", *addresses])
    san = x509.SubjectAlternativeName(
        [x509.DNSName("localhost"), *(x509.IPAddress(ipaddress.ip_address(a)) for a in ips)]
    )
    leaf = (
        x509.CertificateBuilder()
        .subject_name(_name(f"{name} peer"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
        .add_extension(san, critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    paths = {part: directory / f"{name}-{part}.pem" for part in ("ca", "cert", "key")}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    paths["key"].write_bytes(_pem_key(key))
    return cf.TLSConfig(paths["cert"], paths["key"], paths["ca"], client_auth=client_auth)


def tls_kwargs(tls: cf.TLSConfig) -> dict[str, str | bool]:
    """The settings of ``tls`` as JSON-friendly keyword arguments of :class:`cf.TLSConfig`
    (for worker processes)."""
    return {"cert": str(tls.cert), "key": str(tls.key), "ca": str(tls.ca), "client_auth": tls.client_auth}


# The command most guides give for a self-signed certificate (docs/hardening.md shows it), word
# for word.
OPENSSL_SELF_SIGNED = (
    "openssl req -x509 -newkey rsa:2048 -nodes -keyout k.pem -out c.pem "
    "-subj /CN=localhost -addext subjectAltName=IP:127.0.0.1"
)


def openssl_self_signed(directory: Path) -> cf.TLSConfig:
    """Runs :data:`OPENSSL_SELF_SIGNED` in ``directory`` (made if missing) and returns
    ``TLSConfig(cert="c.pem", key="k.pem", ca="c.pem")`` there."""
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run(OPENSSL_SELF_SIGNED.split(), cwd=directory, check=True, capture_output=True, timeout=120)
    return cf.TLSConfig(directory / "c.pem", directory / "k.pem", directory / "c.pem")
