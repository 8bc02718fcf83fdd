"""A test CA and a certificate for `<domain>`, `api.<domain>` and `*.<domain>`, made with
the openssl command (ECDSA P-256, valid two days): what an operator's wildcard certificate
is to a node or a gateway. Nothing is added to the host's trust store: clients get the CA
through the environment (SSL_CERT_FILE for the Python SDK's rustls, NODE_EXTRA_CA_CERTS
for Node)."""

from __future__ import annotations

import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Certs:
    ca: Path  # PEM: the test CA's certificate
    cert: Path  # PEM: the server certificate
    key: Path  # PEM: its key

    def by_address(self) -> ssl.SSLContext:
        """For probes that reach the server by IP address: the chain is verified against
        the test CA, the name (which the certificate has for the domain only) is not."""
        ctx = ssl.create_default_context(cafile=str(self.ca))
        ctx.check_hostname = False
        return ctx


def _openssl(*args: str, cwd: Path) -> None:
    r = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"openssl {args[0]}: {r.stderr}"


def make_certs(where: Path, domain: str) -> Certs:
    where.mkdir(parents=True, exist_ok=True)
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", "/CN=aenv test CA", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=where)  # fmt: skip
    _openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr",
             "-subj", f"/CN=*.{domain}", cwd=where)  # fmt: skip
    (where / "server.ext").write_text(
        f"subjectAltName=DNS:{domain},DNS:api.{domain},DNS:*.{domain}\n"
        "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
        "extendedKeyUsage=serverAuth\n")  # fmt: skip
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "server.ext",
             cwd=where)  # fmt: skip
    return Certs(where / "ca.pem", where / "server.pem", where / "server.key")


@dataclass(frozen=True)
class MutualCerts:
    """A CA, a server certificate for 127.0.0.1 and localhost (also usable by a peer), and
    client certificates by common name: what an operator gives etcd and its clients."""

    ca: Path
    server_cert: Path
    server_key: Path
    clients: dict[str, tuple[Path, Path]]  # CN -> (certificate, key)

    def client_context(self, cn: str) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca))
        cert, key = self.clients[cn]
        ctx.load_cert_chain(str(cert), str(key))
        return ctx


def make_mutual_certs(where: Path, clients: tuple[str, ...] = ("aenv",)) -> MutualCerts:
    where.mkdir(parents=True, exist_ok=True)
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", "/CN=aenv test cluster CA", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=where)  # fmt: skip

    def issue(name: str, cn: str, ext: str) -> tuple[Path, Path]:
        # No CN for "": etcd's JSON gateway refuses a certificate's CN once auth is on.
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN={cn}" if cn else "/O=aenv", cwd=where)  # fmt: skip
        (where / f"{name}.ext").write_text(ext)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile",
                 f"{name}.ext", cwd=where)  # fmt: skip
        return where / f"{name}.pem", where / f"{name}.key"

    leaf = "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
    server = issue("server", "127.0.0.1", leaf + "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                   "extendedKeyUsage=serverAuth,clientAuth\n")
    made = {cn: issue(f"client-{cn or 'anonymous'}", cn,
                      leaf + "extendedKeyUsage=clientAuth\n") for cn in clients}  # fmt: skip
    return MutualCerts(where / "ca.pem", *server, made)
