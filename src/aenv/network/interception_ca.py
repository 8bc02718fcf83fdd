"""The CA of the egress proxy's TLS interception, for `network.rules` domains only.

A node's CA (an EC P-256 key, 10 years) is made on first use at
`<data_dir>/egress-ca.{pem,key}` unless `network.ca_cert_file`/`ca_key_file` name a pair,
which every node of a cluster then shares (a sandbox resumed or forked elsewhere trusts the
same CA). Its key never leaves the host. Leaf certificates, one per intercepted name, last
a week and are kept in memory; they are signed again after a restart.

The CA is name-constrained to nothing: it may sign any name, which is why only the names
a sandbox's own rules list are ever intercepted, and why guests trust it only while their
policy has rules (`guest_trust.py`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import secrets
import ssl
import tempfile
import time
from functools import lru_cache
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from aenv.config import Config

CA_DAYS = 3650
LEAF_DAYS = 7
RENEW_DAYS = 3
CA_NAME = "aenv egress CA"


def ca_paths(config: Config) -> tuple[Path, Path]:
    n = config.network
    return (n.ca_cert_file or config.data_dir / "egress-ca.pem",
            n.ca_key_file or config.data_dir / "egress-ca.key")  # fmt: skip


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _make_ca(cert_path: Path, key_path: Path) -> None:
    """Both files at once, exclusively: a node that loses the race reads the winner's."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CA_NAME)])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(_now() - dt.timedelta(hours=1))
            .not_valid_after(_now() + dt.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False,
                                         False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256()))  # fmt: skip
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())  # fmt: skip
    cert_path.parent.mkdir(parents=True, exist_ok=True)
    tag = f"{os.getpid()}.{secrets.token_hex(4)}"
    tmp_key, tmp_cert = (p.with_name(f".{p.name}.{tag}") for p in (key_path, cert_path))
    try:
        for tmp, data in ((tmp_key, key_pem), (tmp_cert, cert.public_bytes(
                serialization.Encoding.PEM))):  # fmt: skip
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
        # The key first: a certificate on disk always has its key beside it.
        with contextlib.suppress(FileExistsError):
            os.link(tmp_key, key_path)
            os.link(tmp_cert, cert_path)
    finally:
        for tmp in (tmp_key, tmp_cert):
            tmp.unlink(missing_ok=True)
    cert_path.chmod(0o644)


class InterceptionCA:
    def __init__(self, cert_pem: str, key_pem: str) -> None:
        self.pem, self.key_pem = cert_pem, key_pem
        self._cert = x509.load_pem_x509_certificate(cert_pem.encode())
        key = serialization.load_pem_private_key(key_pem.encode(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError("the egress CA key must be an EC key")
        self._key = key
        self._leaf_key = ec.generate_private_key(ec.SECP256R1())  # one for every leaf
        self._leaf_key_pem = self._leaf_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption())  # fmt: skip
        self._contexts = lru_cache(maxsize=1024)(self._server_context)

    def server_context(self, name: str) -> ssl.SSLContext:
        # Keyed by the period too: a leaf is signed again every RENEW_DAYS, long before
        # it expires, however long the node runs.
        return self._contexts(name, int(time.time() // (RENEW_DAYS * 86400)))

    def _leaf(self, name: str) -> bytes:
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
                .issuer_name(self._cert.subject).public_key(self._leaf_key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(_now() - dt.timedelta(hours=1))
                .not_valid_after(_now() + dt.timedelta(days=LEAF_DAYS))
                .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                               critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                    self._key.public_key()), critical=False)
                .sign(self._key, hashes.SHA256()))  # fmt: skip
        return cert.public_bytes(serialization.Encoding.PEM) + self.pem.encode()

    def _server_context(self, name: str, _period: int) -> ssl.SSLContext:
        """A TLS server context presenting `name`'s certificate, HTTP/1.1 only (the proxy
        rewrites HTTP/1 requests)."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_alpn_protocols(["http/1.1"])
        # ssl loads a chain from files only: a private temporary directory, gone at once.
        with tempfile.TemporaryDirectory(prefix="aenv-leaf-") as d:
            chain, key = Path(d) / "chain.pem", Path(d) / "key.pem"
            chain.write_bytes(self._leaf(name))
            key.write_bytes(self._leaf_key_pem)
            ctx.load_cert_chain(chain, key)
        return ctx


def load_ca(cert_path: Path, key_path: Path) -> InterceptionCA:
    """The CA in those files, made now if there is none."""
    if not cert_path.exists():
        _make_ca(cert_path, key_path)
    return InterceptionCA(cert_path.read_text(), key_path.read_text())


def upstream_context(config: Config) -> ssl.SSLContext:
    """How the proxy checks the servers it forwards intercepted requests to: the system
    store, plus the operator's `network.upstream_ca_file`."""
    ctx = ssl.create_default_context()
    ctx.set_alpn_protocols(["http/1.1"])
    if config.network.upstream_ca_file is not None:
        ctx.load_verify_locations(cafile=config.network.upstream_ca_file)
    return ctx
