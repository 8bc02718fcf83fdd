"""Template names per team. The node keeps one catalog: the default team's templates (and
those `aenv setup` builds) under their own names, public to every team, as E2B's public
templates are; another team's as `<name>~<team id>`, seen by that team alone under `<name>`,
and found before a public template of the same name. `~` is in no name a client may give
(api/builds.py), so a scoped name never collides with a public one and never leaks."""

from __future__ import annotations

from aenv.teams.model import DEFAULT_TEAM

SEP = "~"


def scoped(name: str, team_id: str) -> str:
    """The node's name for the team's template `name` (`name[:tag]`)."""
    if team_id == DEFAULT_TEAM:
        return name
    base, colon, tag = name.partition(":")
    return f"{base}{SEP}{team_id}{colon}{tag}"


def shown(name: str) -> str:
    """What its owner calls a template the node names `name`."""
    base, _, rest = name.partition(SEP)
    _, colon, tag = rest.partition(":")
    return f"{base}{colon}{tag}" if rest else name


def visible(name: str, team_id: str) -> bool:
    """Whether the team sees the template the node names `name`: a public one, or its own."""
    if SEP not in name:
        return True
    return name.partition(SEP)[2].partition(":")[0] == team_id


def owns(name: str, team_id: str) -> bool:
    """Whether the team owns the template the node names `name` (the default team owns the
    public ones)."""
    return visible(name, team_id) and (SEP in name or team_id == DEFAULT_TEAM)


def candidates(name: str, team_id: str) -> list[str]:
    """What a team's `name` may be, in order: its own, then a public one. A name that holds
    the separator already is the node's: the team's own, or none of its."""
    if SEP in name:
        return [name] if visible(name, team_id) else []
    own = scoped(name, team_id)
    return [own] if own == name else [own, name]
