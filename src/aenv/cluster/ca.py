"""The cluster's CA for its links (links.py): `aenv cluster ca init DIR` makes one,
`aenv cluster ca issue DIR NAME --host H` a certificate for a node or gateway.

    DIR/ca.pem  ca.key          the CA (EC P-256; its key 0600, kept off the members)
    DIR/NAME.pem  NAME.key      a member's certificate (server and client) and key

An operator with a CA of their own gives its files instead; the members need only
`ca.pem` and their own pair. Validity: the CA 10 years, a member 1 year (rotation:
docs/cluster.md, "Links").
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS = 3650
MEMBER_DAYS = 365
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


class CaError(Exception):
    """One line for the CLI."""


def init(where: Path, name: str = "aenv cluster CA") -> Path:
    """A new CA in `where`; refuses to replace one."""
    cert, key = where / "ca.pem", where / "ca.key"
    if cert.exists() or key.exists():
        raise CaError(f"{where} already holds a CA ({cert.name}); a new one would orphan "
                      "every certificate it signed")
    where.mkdir(parents=True, exist_ok=True)
    k = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    c = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
         .public_key(k.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now - dt.timedelta(minutes=5))
         .not_valid_after(now + dt.timedelta(days=CA_DAYS))
         .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
         .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                      key_encipherment=False, data_encipherment=False,
                                      key_agreement=False, key_cert_sign=True, crl_sign=True,
                                      encipher_only=False, decipher_only=False), critical=True)
         .add_extension(x509.SubjectKeyIdentifier.from_public_key(k.public_key()), False)
         .sign(k, hashes.SHA256()))  # fmt: skip
    _write_key(key, k)
    cert.write_bytes(c.public_bytes(serialization.Encoding.PEM))
    return cert


def issue(where: Path, name: str, hosts: list[str], days: int = MEMBER_DAYS) -> tuple[Path, Path]:
    """A certificate for member `name` valid for `hosts` (DNS names or IP addresses its
    URL uses), signed by the CA in `where`; written as NAME.pem and NAME.key there."""
    if not NAME_RE.match(name):
        raise CaError(f"{name!r} is not a member name (letters, digits, . _ -)")
    if not hosts:
        raise CaError("name at least one --host: the host names or addresses its URL uses")
    try:
        ca_cert = x509.load_pem_x509_certificate((where / "ca.pem").read_bytes())
        ca_key = serialization.load_pem_private_key((where / "ca.key").read_bytes(), None)
    except FileNotFoundError:
        raise CaError(f"no CA in {where} (aenv cluster ca init {where})") from None
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise CaError(f"{where / 'ca.key'} is not an EC key")
    sans: list[x509.GeneralName] = []
    for h in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            sans.append(x509.DNSName(h))
    k = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    c = (x509.CertificateBuilder()
         .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
         .issuer_name(ca_cert.subject).public_key(k.public_key())
         .serial_number(x509.random_serial_number())
         .not_valid_before(now - dt.timedelta(minutes=5))
         .not_valid_after(now + dt.timedelta(days=days))
         .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
         .add_extension(x509.SubjectAlternativeName(sans), critical=False)
         .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                               ExtendedKeyUsageOID.CLIENT_AUTH]), False)
         .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
             ca_key.public_key()), False)
         .sign(ca_key, hashes.SHA256()))  # fmt: skip
    cert, key = where / f"{name}.pem", where / f"{name}.key"
    _write_key(key, k)
    cert.write_bytes(c.public_bytes(serialization.Encoding.PEM))
    return cert, key


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    data = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())  # fmt: skip
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    tmp.replace(path)
