"""Nodes' overviews joined by a gateway (cluster/gateway/overview.py)."""

from __future__ import annotations

from typing import Any

from aenv.cluster.gateway.overview import join


def _doc(running: int, history: list[tuple[float, int]], admin: bool) -> dict[str, Any]:
    now = {"running": running, "paused": 1, "hot": 0, "cold": 1, "memoryMB": running * 512}
    points = [{"t": t, "running": r, "paused": 1, "memoryMB": r * 512} for t, r in history]
    node = {"maxSandboxes": 10, "now": now, "history": [
        {**p, "createsPerMin": 1.0, "forksPerMin": 0.0, "heldMiB": 100.0} for p in points]}
    return {"sampleEveryS": 10.0, "node": node if admin else None, "team": {
        "teamID": "t", "name": "t", "maxSandboxes": 5, "maxMemoryMB": None, "now": now,
        "history": points}}  # fmt: skip


def test_holdings_are_summed_and_histories_by_sampling_period() -> None:
    out = join([_doc(2, [(100.0, 1), (103.0, 2), (111.0, 2)], True),
                _doc(3, [(105.0, 3), (118.0, 4)], True)])
    assert out["team"]["now"] == {"running": 5, "paused": 2, "hot": 0, "cold": 2,
                                  "memoryMB": 5 * 512}  # fmt: skip
    assert out["team"]["maxSandboxes"] == 5  # the team's limit is the cluster's
    # Period 10 (100-110 s): the first node's last sample (2) and the second's (3).
    assert [(p["t"], p["running"]) for p in out["team"]["history"]] == [(100.0, 5), (110.0, 6)]
    assert out["node"]["maxSandboxes"] == 20
    assert out["node"]["history"][0]["heldMiB"] == 200.0
    assert out["node"]["history"][0]["createsPerMin"] == 2.0


def test_a_key_that_is_not_an_admins_gets_no_node() -> None:
    assert join([_doc(1, [], False), _doc(1, [], False)])["node"] is None
