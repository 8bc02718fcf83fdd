"""The link to etcd (cluster/etcd.py, issue 33): a real etcd serving https only, requiring
client certificates (--client-cert-auth) and with its users and roles on (auth tokens that
expire in 2 s); and the rules for what a configuration may reach."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from aenv.cluster.etcd import Etcd, EtcdError, EtcdRefused, EtcdSecurity
from aenv.cluster.secrets import EtcdSecrets, SecretsKeyMismatch
from aenv.secrets.vault import Vault
from tests.support.etcd import EtcdCluster, enable_auth, etcd_cluster
from tests.support.tls import MutualCerts, make_mutual_certs


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> MutualCerts:
    # aenv's certificate has no CN: etcd's JSON gateway refuses one that has (below).
    return make_mutual_certs(tmp_path_factory.mktemp("etcd-tls"), clients=("", "aenv", "root"))


@pytest.fixture(scope="module")
def secured(certs: MutualCerts) -> Iterator[EtcdCluster]:
    with etcd_cluster(1, tls=certs, extra=("--auth-token-ttl", "2")) as c:
        enable_auth(c, certs)
        yield c


def _security(certs: MutualCerts, **kw: object) -> EtcdSecurity:
    cert, key = certs.clients[""]
    base: dict[str, object] = {"ca_file": certs.ca, "cert_file": cert, "key_file": key,
                               "user": "aenv", "password": "aenv-pw"}  # fmt: skip
    return EtcdSecurity(**{**base, **kw})  # type: ignore[arg-type]


async def test_every_call_goes_over_tls_with_a_certificate_and_a_user(
        secured: EtcdCluster, certs: MutualCerts) -> None:  # fmt: skip
    etcd = Etcd(secured.endpoints, security=_security(certs))
    try:
        await etcd.put("/t/a", "1")
        assert (await etcd.get("/t/a")).value == b"1"  # type: ignore[union-attr]
        lease = await etcd.grant(10)
        assert await etcd.keepalive(lease) > 0
        _, rev = await etcd.get_prefix("/t/")
        watch = etcd.watch_prefix("/t/", rev + 1)
        got = asyncio.ensure_future(anext(watch))
        await etcd.put("/t/b", "2")
        assert (await asyncio.wait_for(got, 10)).kv.key == "/t/b"
        await watch.aclose()
        token = etcd._token
        await asyncio.sleep(3)  # the token expired: a new one is asked, the call goes on
        assert (await etcd.get("/t/b")).value == b"2"  # type: ignore[union-attr]
        assert etcd._token and etcd._token != token
    finally:
        await etcd.aclose()


async def test_a_wrong_or_missing_credential_is_refused_in_one_line(
        secured: EtcdCluster, certs: MutualCerts, tmp_path: Path) -> None:  # fmt: skip
    other = make_mutual_certs(tmp_path / "other")
    for sec, words in (
        (_security(certs, ca_file=other.ca), "TLS failed"),  # a server it cannot verify
        # etcd closes the connection (TLS 1.3 tells the client on its first read)
        (_security(certs, cert_file=None, key_file=None), "TLS failed|client certificate"),
        (_security(certs, cert_file=other.clients["aenv"][0], key_file=other.clients[
            "aenv"][1]), "TLS failed|client certificate"),  # another CA's
        (_security(certs, password="wrong"), "refused user 'aenv'"),
        (_security(certs, cert_file=certs.clients["aenv"][0],
                   key_file=certs.clients["aenv"][1]), "without a CN"),
    ):  # fmt: skip
        etcd = Etcd(secured.endpoints, security=sec, retry_s=0.5)
        try:
            with pytest.raises(EtcdError, match=words) as e:
                await etcd.get("/t/a")
            assert "\n" not in str(e.value)
        finally:
            await etcd.aclose()


async def test_an_etcd_without_authentication_is_refused_unless_allowed(
        one: EtcdCluster) -> None:  # fmt: skip
    for insecure in (False, True):
        sec = EtcdSecurity(user="aenv", password="pw", insecure=insecure)
        etcd = Etcd(one.endpoints, security=sec)
        try:
            if insecure:
                await etcd.put("/t/open", "1")  # allowed: no token, none asked again
            else:
                with pytest.raises(EtcdRefused, match="authentication off"):
                    await etcd.get("/t/open")
        finally:
            await etcd.aclose()


def test_what_a_configuration_may_reach(caplog: pytest.LogCaptureFixture) -> None:
    cert = EtcdSecurity(ca_file=Path("/ca.pem"), cert_file=Path("/c.pem"), key_file=Path("/k"))
    user = EtcdSecurity(user="u", password="p")
    caplog.set_level(logging.WARNING)
    for endpoints, sec, ok, warned in (
        (["http://127.0.0.1:2379", "http://localhost:2379", "http://[::1]:2379"],
         EtcdSecurity(), True, ""),  # this host
        (["http://10.0.0.1:2379"], EtcdSecurity(), False, ""),  # no credential
        (["https://10.0.0.1:2379"], EtcdSecurity(), False, ""),
        (["https://10.0.0.1:2379"], cert, True, ""),
        (["https://10.0.0.1:2379"], user, True, ""),
        (["http://10.0.0.1:2379"], user, True, "is plain HTTP"),  # allowed, and said
        (["http://10.0.0.1:2379"], EtcdSecurity(insecure=True), True, "no authentication"),
        (["etcd:2379"], EtcdSecurity(), False, ""),
    ):  # fmt: skip
        caplog.clear()
        if ok:
            sec.check(endpoints)
        else:
            with pytest.raises(EtcdRefused):
                sec.check(endpoints)
        assert (warned in caplog.text) if warned else not caplog.text, (endpoints, sec)


async def test_the_generated_secrets_key_never_goes_to_an_unprotected_etcd() -> None:
    etcd = Etcd(["http://10.0.0.1:2379"], security=EtcdSecurity(insecure=True))
    try:
        shared = EtcdSecrets(etcd, "/t/", Vault(b"k" * 32))
        with pytest.raises(SecretsKeyMismatch, match="in the clear"):
            await shared.join(b"k" * 32, explicit=False)  # refused before any call
    finally:
        await etcd.aclose()
