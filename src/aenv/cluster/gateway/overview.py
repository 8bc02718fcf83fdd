"""`GET /overview` through a gateway: every node's answer (api/overview.py) joined into the
cluster's: the team's and the nodes' holdings summed, their histories summed by sampling
period (each node samples on its own clock; one sample of each per period)."""

from __future__ import annotations

from typing import Any

_TEAM = ("running", "paused", "memoryMB")
_NODE = (*_TEAM, "createsPerMin", "forksPerMin", "heldMiB")
_NOW = ("running", "paused", "hot", "cold", "memoryMB")


def join(docs: list[dict[str, Any]]) -> dict[str, Any]:
    every = max(d["sampleEveryS"] for d in docs)
    team = dict(docs[0]["team"])
    team["now"] = _sum([d["team"]["now"] for d in docs], _NOW)
    team["history"] = _by_period([d["team"]["history"] for d in docs], every, _TEAM)
    out: dict[str, Any] = {"sampleEveryS": every, "team": team, "node": None}
    nodes = [d["node"] for d in docs if d.get("node") is not None]
    if nodes:
        out["node"] = {
            "maxSandboxes": sum(n["maxSandboxes"] for n in nodes),
            "now": _sum([n["now"] for n in nodes], _NOW),
            "history": _by_period([n["history"] for n in nodes], every, _NODE),
        }
    return out


def _sum(items: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: round(sum(i[k] for i in items), 2) for k in keys}


def _by_period(histories: list[list[dict[str, Any]]], every: float,
               keys: tuple[str, ...]) -> list[dict[str, Any]]:  # fmt: skip
    periods: dict[int, dict[int, dict[str, Any]]] = {}  # period -> node -> its last sample
    for i, history in enumerate(histories):
        for p in history:
            periods.setdefault(int(p["t"] // every), {})[i] = p
    return [{"t": period * every, **_sum(list(by_node.values()), keys)}
            for period, by_node in sorted(periods.items())]  # fmt: skip
