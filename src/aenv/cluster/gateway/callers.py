"""Who calls the gateway: the team of the request's key (etcd's teams, cluster/teams.py),
and the limits the placement holds that team to across the cluster."""

from __future__ import annotations

from typing import Any

from aenv.cluster.placement import TeamQuota
from aenv.cluster.teams import EtcdTeams
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
