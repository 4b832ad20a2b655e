"""The per-session CA that lets the host's proxy terminate TLS for secret-injecting hosts, and its leaves.

The CA is made on the host for one session and only its certificate enters the guest. It is name-constrained
to the hosts that get a secret injected, so even a leaked key could not vouch for any other site.
"""

from __future__ import annotations

import datetime
import os
import ssl
from collections.abc import Iterable
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS = 30
LEAF_DAYS = 7


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def create_ca(cert_path: Path, key_path: Path, *, session: str, hosts: Iterable[str]) -> None:
    """A new CA key (0600) and certificate limited to `hosts` (DNS name constraints)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "vmsandbox"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"vmsandbox session {session} CA"),
        ]
    )
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
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
        .add_extension(
            x509.NameConstraints(
                permitted_subtrees=[x509.DNSName(h) for h in sorted(set(hosts))], excluded_subtrees=None
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


class Issuer:
    """Signs a leaf certificate per host name with the session CA, and keeps a server SSL context for each."""

    def __init__(self, cert_path: Path, key_path: Path) -> None:
        self._ca = x509.load_pem_x509_certificate(cert_path.read_bytes())
        loaded = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        if not isinstance(loaded, ec.EllipticCurvePrivateKey):
            raise TypeError("the session CA key is not an EC key")
        self._key = loaded
        self._contexts: dict[str, ssl.SSLContext] = {}

    def context(self, host: str) -> ssl.SSLContext:
        ctx = self._contexts.get(host)
        if ctx is None:
            ctx = self._contexts[host] = self._make_context(host)
        return ctx

    def _make_context(self, host: str) -> ssl.SSLContext:
        key = ec.generate_private_key(ec.SECP256R1())
        now = _now()
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
            .issuer_name(self._ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=LEAF_DAYS))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_alpn_protocols(["http/1.1"])
        chain = cert.public_bytes(serialization.Encoding.PEM) + self._ca.public_bytes(serialization.Encoding.PEM)
        pem = serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        _load_chain(ctx, chain, key.private_bytes(serialization.Encoding.PEM, *pem))
        return ctx


def _load_chain(ctx: ssl.SSLContext, chain: bytes, key: bytes) -> None:
    """ssl loads certificates from files only: these are memory files (memfd), named through /proc/self/fd, so
    nothing is written to a disk or needs a directory the daemon (no longer root) may write."""
    fds = [os.memfd_create("vmsandbox-leaf-chain"), os.memfd_create("vmsandbox-leaf-key")]
    try:
        for fd, data in zip(fds, (chain, key), strict=True):
            os.write(fd, data)
        ctx.load_cert_chain(f"/proc/self/fd/{fds[0]}", f"/proc/self/fd/{fds[1]}")
    finally:
        for fd in fds:
            os.close(fd)
