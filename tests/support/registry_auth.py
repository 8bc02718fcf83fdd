"""Registries that want credentials, for the pull tests: HTTPS with a CA made here and
htpasswd users (basic auth), and bearer tokens from a realm (a small token server of our own
issuing the JWTs distribution's `auth: token` checks). Keys and certificates come from the
openssl command; passwords are bcrypt-hashed with the C library's crypt."""

from __future__ import annotations

import base64
import contextlib
import http.server
import json
import subprocess
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.host import free_port
from tests.support.registry import Registry

USER, PASSWORD = "alice", "s3cret-pw"


def _openssl(*args: str) -> None:
    p = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr


@dataclass(frozen=True)
class Pki:
    ca: Path
    cert: Path
    key: Path


def make_pki(d: Path) -> Pki:
    """A CA, and a certificate for 127.0.0.1 it signed."""
    d.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(d / "ca.key"),
             "-out", str(d / "ca.crt"), "-days", "2", "-subj", "/CN=aenv test CA")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(d / "srv.key"), "-out",
             str(d / "srv.csr"), "-subj", "/CN=127.0.0.1")
    (d / "ext").write_text("subjectAltName=IP:127.0.0.1\n")
    _openssl("x509", "-req", "-in", str(d / "srv.csr"), "-CA", str(d / "ca.crt"), "-CAkey",
             str(d / "ca.key"), "-CAcreateserial", "-out", str(d / "srv.crt"), "-days", "2",
             "-extfile", str(d / "ext"))
    return Pki(d / "ca.crt", d / "srv.crt", d / "srv.key")


def htpasswd_registry(root: Path, pki: Pki) -> Registry:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt  # deprecated in 3.11, and the one bcrypt the stdlib has

        hashed = crypt.crypt(PASSWORD, crypt.mksalt(crypt.METHOD_BLOWFISH))
    root.mkdir(parents=True, exist_ok=True)
    (root / "htpasswd").write_text(f"{USER}:{hashed}\n")
    return Registry(root, tls=(pki.cert, pki.key),
                    auth=f"{{htpasswd: {{realm: aenv, path: {root / 'htpasswd'}}}}}")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class _TokenServer(http.server.BaseHTTPRequestHandler):
    key: Path
    cert_der: bytes
    issuer = "aenv-test-issuer"
    service = "aenv-test-registry"

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        if self.headers.get("Authorization") != "Basic " + base64.b64encode(
                f"{USER}:{PASSWORD}".encode()).decode():
            self.send_response(401)
            self.end_headers()
            return
        from urllib.parse import parse_qs, urlparse

        q = parse_qs(urlparse(self.path).query)
        access = []
        for scope in q.get("scope", []):
            kind, name, actions = scope.split(":", 2)
            access.append({"type": kind, "name": name, "actions": actions.split(",")})
        now = int(time.time())
        header = {"alg": "RS256", "typ": "JWT", "x5c": [base64.b64encode(self.cert_der).decode()]}
        claims = {"iss": self.issuer, "sub": USER, "aud": self.service, "exp": now + 300,
                  "nbf": now - 10, "iat": now, "jti": str(now), "access": access}
        signing = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
        sig = subprocess.run(["openssl", "dgst", "-sha256", "-sign", str(self.key)],
                             input=signing.encode(), capture_output=True, check=True).stdout
        body = json.dumps({"token": f"{signing}.{_b64(sig)}"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@contextlib.contextmanager
def token_registry(root: Path, pki: Pki) -> Iterator[Registry]:
    """A plain-HTTP registry on loopback that wants bearer tokens from our own realm."""
    der = root / "tok.der"
    root.mkdir(parents=True, exist_ok=True)
    _openssl("x509", "-in", str(pki.cert), "-outform", "DER", "-out", str(der))
    handler = type("Tokens", (_TokenServer,), {"key": pki.key, "cert_der": der.read_bytes()})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    realm = f"http://127.0.0.1:{server.server_address[1]}/token"
    reg = Registry(root, auth=(f"{{token: {{realm: '{realm}', service: {_TokenServer.service},"
                               f" issuer: {_TokenServer.issuer}, rootcertbundle: {pki.cert}}}}}"))
    try:
        yield reg.start()
    finally:
        reg.stop()
        server.shutdown()
