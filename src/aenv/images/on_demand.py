"""Sandboxes from image references, on demand (docs/api.md, "Images on demand").

A create whose template is an image reference, or whose metadata names an image under the
operator's `image_metadata_key`, boots that image: the node pulls it into its bounded cache
if needed and makes its template once (`images.templates`, the template a build FROM that
image starts from); creates of one image while that runs wait for the same work (the
"template not ready" rule, `orchestrator.pending`), so a burst of them is one pull.

What counts as an image: a template name is looked up first; a value is an image only if it
has a registry host or a digest (`ghcr.io/org/img:1`, `127.0.0.1:5000/x`, `x@sha256:…`), or,
with `image_short_names`, any reference (`ubuntu:22.04` is Docker Hub's unless a template
of that name exists). Which registries may be pulled is `image_registries`; the build API's
`fromImage` is held to the same list. A reference is made once: later creates reuse its
template (`aenv pull` refreshes a tag).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any

from aenv.config import Config
from aenv.images.reference import BadReference, Reference, has_registry, parse
from aenv.machines.api import TemplateNotFound
from aenv.orchestrator.errors import Forbidden, InvalidRequest
from aenv.orchestrator.pending import PendingTemplates
from aenv.storage.files import write_json_atomic
from aenv.storage.templates import TemplateMissing
from aenv.tasks import TaskSet

log = logging.getLogger(__name__)


def allowed(registries: list[str], ref: Reference) -> bool:
    """Whether `ref` is under one of `registries` (`host`, `host:port`, `host/path`, "*")."""
    for entry in registries:
        if entry == "*":
            return True
        host, _, path = entry.partition("/")
        if host not in (ref.registry, ref.host):
            continue
        if not path or ref.repository == path or ref.repository.startswith(path + "/"):
            return True
    return False


class OnDemandImages:
    """`runtime` is the node's Runtime; `pending` the orchestrator's templates on their way;
    `registries_of(team_id)` a team's own `imageRegistries` (None: the node's list)."""

    def __init__(self, cfg: Config, runtime: Any, pending: PendingTemplates,
                 registries_of: Callable[[str], tuple[str, ...] | None] = lambda _t: None,
                 ) -> None:  # fmt: skip
        self.cfg = cfg
        self.rt = runtime
        self.pending = pending
        self._registries_of = registries_of
        self._made_path = cfg.images_dir / "on-demand.json"  # reference -> its template
        self._failed: dict[str, str] = {}  # reference -> why its last try failed
        self._tasks = TaskSet()

    # -- what is an image, and which may be pulled ---------------------------------------

    def image_in(self, metadata: dict[str, str]) -> str | None:
        key = self.cfg.image_metadata_key
        return metadata.get(key) if key else None

    def is_image(self, name: str) -> bool:
        return has_registry(name) or self.cfg.image_short_names

    def check(self, text: str, team_id: str | None = None) -> Reference:
        """The reference, if this node may pull it for `team_id`: InvalidRequest (400) if it
        is none, Forbidden (403) outside the team's `imageRegistries` or, if it has none, the
        node's `image_registries`. The node's own exports always may."""
        try:
            ref = parse(text)
        except BadReference as e:
            raise InvalidRequest(str(e)) from None
        own = self._registries_of(team_id) if team_id is not None else None
        if self._local(ref) or allowed(self.cfg.image_registries if own is None else own, ref):
            return ref
        raise Forbidden(f"image {text!r}: registry {ref.registry} is not one "
                        + ("this node pulls from (image_registries)" if own is None else
                           "the team may pull from (its imageRegistries)"))  # fmt: skip

    def _local(self, ref: Reference) -> bool:
        from aenv.images.templates import image_cache

        return image_cache(self.cfg).local.get(ref) is not None

    # -- its template --------------------------------------------------------------------

    async def template_for(self, text: str, team_id: str | None = None) -> str:
        """The template made of image `text`: made now (or by the work already making it)
        if need be. Forbidden, InvalidRequest, TemplateNotReady (503, past the node's wait
        bound: the work goes on), TemplateNotFound (404: the pull failed, with why)."""
        ref = self.check(text, team_id)
        key = str(ref)
        if (name := self._known(key)) is not None:
            return name
        # Pending under `image:<ref>`: never a template's name, which a create waits for.
        p = self.pending.find([f"image:{key}"])
        if p is None:
            self._failed.pop(key, None)
            task = self._tasks.spawn(self._make(key), f"aenv-pull-{key}")
            self.pending.track([f"image:{key}"], "pull", lambda: f"pulling {key}", task)
            p = self.pending.find([f"image:{key}"])
        if p is not None:
            await self.pending.wait(p)
        if (name := self._known(key)) is not None:
            return name
        raise TemplateNotFound(f"image {text!r}: {self._failed.get(key, 'not made')}")

    async def _make(self, key: str) -> None:
        from aenv.images.templates import template_from_image

        try:
            t = await template_from_image(self.rt, key, None, progress=lambda m: log.info(
                "image %s: %s", key, m))  # fmt: skip
        except Exception as e:  # its creates answer with why
            self._failed[key] = f"pulling it failed: {e}"
            log.warning("image %s: %s", key, self._failed[key])
            return
        made = self._read()
        made[key] = t.name
        write_json_atomic(self._made_path, made)
        log.info("image %s: template %s", key, t.name)

    def made(self) -> dict[str, str]:
        """Each image whose template this node holds, with that template's name (its node
        record says so: a gateway then places the image's creates here)."""
        return {key: name for key in self._read() if (name := self._known(key)) is not None}

    def _known(self, key: str) -> str | None:
        """The template made of `key` earlier, if it is still here."""
        name = self._read().get(key)
        if name is None:
            return None
        try:
            t = self.rt.catalog.get(name)
        except TemplateMissing:
            return None
        return str(t.name) if self.rt.has_snapshot(t.snapshot_id) else None

    def _read(self) -> dict[str, str]:
        with contextlib.suppress(FileNotFoundError, ValueError):
            d = json.loads(self._made_path.read_text())
            if isinstance(d, dict):
                return {str(k): str(v) for k, v in d.items()}
        return {}

    async def close(self) -> None:
        await self._tasks.close()
