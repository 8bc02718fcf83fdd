"""Pulls from registries that want credentials: basic auth over HTTPS with a CA of the
test's own, and bearer tokens from a `WWW-Authenticate` realm; each failure is its kind."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from aenv.images.cache import ImageCache
from aenv.images.reference import parse
from aenv.images.registry import Credentials, RegistryError, RegistrySettings, Skopeo
from tests.support.registry import OciImage, busybox_tree, have_tools
from tests.support.registry_auth import PASSWORD, USER, htpasswd_registry, make_pki, token_registry

pytestmark = pytest.mark.skipif(have_tools() is not None, reason=have_tools() or "")
GOOD, BAD = Credentials(USER, PASSWORD), Credentials(USER, "wrong")


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> OciImage:
    img = OciImage(tmp_path_factory.mktemp("image") / "layout", "private")
    img.layer(busybox_tree)
    return img


def _cache(tmp: Path, **settings: object) -> ImageCache:
    return ImageCache(tmp / "images", Skopeo(RegistrySettings(**settings), tmp / "skopeo"))  # type: ignore[arg-type]


def _kind(cache: ImageCache, ref: str, creds: Credentials | None) -> str:
    with pytest.raises(RegistryError) as e:
        cache.pull(parse(ref), creds)
    assert "\n" not in str(e.value)
    return e.value.kind


def test_basic_auth_over_https_with_our_own_ca(image: OciImage, tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    reg = htpasswd_registry(tmp_path / "reg", pki).start()
    try:
        ref = image.push(reg, "team/private:1", creds=f"{USER}:{PASSWORD}")
        # Verified HTTPS even on loopback (which is otherwise trusted, as by Docker): the
        # system CA store does not know our CA, so the registry is refused.
        strict = {"insecure_loopback": False}
        assert _kind(_cache(tmp_path / "a", **strict), ref, GOOD) == "unreachable"
        trusted = _cache(tmp_path / "b", ca_file=pki.ca, **strict)
        assert _kind(trusted, ref, None) == "unauthorized"
        assert _kind(trusted, ref, BAD) == "unauthorized"
        assert trusted.cached_blobs() == set()
        got = trusted.pull(parse(ref), GOOD)
        assert len(got.layers) == 1
        # Credentials from the node's Docker config.json when a pull names none.
        auth = tmp_path / "config.json"
        token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        auth.write_text(json.dumps({"auths": {reg.host: {"auth": token}}}))
        assert _cache(tmp_path / "c", ca_file=pki.ca, auth_file=auth,
                      **strict).pull(parse(ref)) == got
    finally:
        reg.stop()


def test_bearer_tokens_from_the_realm(image: OciImage, tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    with token_registry(tmp_path / "reg", pki) as reg:
        ref = image.push(reg, "team/private:1", creds=f"{USER}:{PASSWORD}")
        cache = _cache(tmp_path / "a")
        assert _kind(cache, ref, None) == "unauthorized"
        assert _kind(cache, ref, BAD) == "unauthorized"
        assert len(cache.pull(parse(ref), GOOD).layers) == 1
