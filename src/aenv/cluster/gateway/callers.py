"""Who calls the gateway and what a create asks for: the team of the request's key (etcd's
teams, cluster/teams.py), the limits the placement holds that team to across the cluster,
and the placement a create body needs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from aenv.cluster.membership import NodeRecord
from aenv.cluster.placement import PlacementRequest, TeamQuota
from aenv.cluster.published import PublishedEntry, newest
from aenv.cluster.teams import EtcdTeams
from aenv.images.reference import image_key
from aenv.orchestrator.requests import new_sandbox_id
from aenv.teams.model import Principal, TeamNotFound


def caller(teams: EtcdTeams | None, scope: dict[str, Any]) -> Principal | None:
    """The principal of the request's key; None without a key or with an unknown one."""
    given = next((v for k, v in scope["headers"] if k == b"x-api-key"), None)
    if given is None or teams is None:
        return None
    return teams.principal(given.decode("latin-1"))


def quota(teams: EtcdTeams | None, scope: dict[str, Any]) -> TeamQuota | None:
    who = caller(teams, scope)
    return None if who is None else team_quota(teams, who.team_id)


def team_quota(teams: EtcdTeams | None, team_id: str) -> TeamQuota:
    if teams is None:
        return TeamQuota(team_id, team_id)
    try:
        t = teams.team(team_id)
    except TeamNotFound:  # deleted since the key was read: its sandboxes hold no limit
        return TeamQuota(team_id, team_id)
    return TeamQuota(t.team_id, t.name, t.max_sandboxes, t.max_memory_mib)


@dataclass(frozen=True, slots=True)
class ImageCreates:
    """How the gateway sees a create of an image (images/on_demand.py does it on a node):
    the operator's metadata key, and the memory of a template made of an image."""

    metadata_key: str = ""
    memory_mib: int = 512


def placement_request(body: bytes, nodes: list[NodeRecord], published: list[PublishedEntry],
                      images: ImageCreates | None = None) -> PlacementRequest | None:
    """What to place for a create body, or None if no node would make it (bad body,
    unknown template). An image's create goes preferably where its template was made."""
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("templateID"), str):
        return None
    template: str = doc["templateID"]
    images = images or ImageCreates()
    metadata = doc.get("metadata")
    named = metadata.get(images.metadata_key) if images.metadata_key and \
        isinstance(metadata, dict) else None  # fmt: skip
    # An image: the metadata's (it wins over the template, as on the node), or a template
    # name that no node and no published snapshot has.
    image = image_key(named) if isinstance(named, str) else None
    if image is None and newest(published, template) is None and \
            not any(template in n.memory_of for n in nodes):  # fmt: skip
        image = image_key(template)
    template = image or template
    memory = doc.get("memoryMB")
    if not isinstance(memory, int) or isinstance(memory, bool):
        memory = max((n.memory_of[template] for n in nodes if template in n.memory_of),
                     default=images.memory_mib if image is not None else None)  # fmt: skip
    if memory is None:  # a snapshot no live node holds may still be in the snapshot store
        entry = newest(published, template)
        memory = entry.memory_mib if entry is not None else None
    if memory is None:
        return None
    return PlacementRequest(sandbox_id=new_sandbox_id(), memory_mib=memory, template=template)
