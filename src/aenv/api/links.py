"""OpenAPI links between control-plane operations: which id an answer carries and which
operations take it next (create -> get/kill/pause/...; snapshot -> delete/create-from).

They are documentation for clients and what stateful fuzzers (schemathesis) follow to run
real sequences instead of guessing ids. One table, keyed by operationId, added to FastAPI's
document in `app._openapi`; `add_links` refuses a link to an operation that does not exist.
"""

from __future__ import annotations

from typing import Any

FROM_BODY = "$response.body#/sandboxID"
FROM_PATH = "$request.path.sandbox_id"

# What can be done with a running sandbox.
ON_RUNNING = ("getSandbox", "killSandbox", "setSandboxTimeout", "refreshSandbox",
              "connectSandboxV2", "getSandboxMetrics", "pauseSandbox", "forkSandbox",
              "createSnapshot", "listSnapshots")  # fmt: skip
# ... and with a paused one.
ON_PAUSED = ("getSandbox", "killSandbox", "resumeSandbox", "connectSandboxV2", "connectSandbox")


def _to(targets: tuple[str, ...], sandbox_id: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for op in targets:
        # /snapshots takes the sandbox as a query parameter; the rest in the path.
        param = "query.sandboxID" if op == "listSnapshots" else "path.sandbox_id"
        out[op] = {"operationId": op, "parameters": {param: sandbox_id}}
    return out


# operationId -> status -> link name -> link
LINKS: dict[str, dict[str, dict[str, dict[str, Any]]]] = {
    "createSandboxV2": {"201": _to(ON_RUNNING, FROM_BODY)},
    "createSandbox": {"201": _to(ON_RUNNING, FROM_BODY)},
    "connectSandboxV2": {"200": _to(ON_RUNNING, FROM_BODY), "201": _to(ON_RUNNING, FROM_BODY)},
    "connectSandbox": {"200": _to(ON_RUNNING, FROM_BODY), "201": _to(ON_RUNNING, FROM_BODY)},
    "resumeSandbox": {"201": _to(ON_RUNNING, FROM_BODY)},
    "pauseSandbox": {"204": _to(ON_PAUSED, FROM_PATH)},
    "killSandbox": {"204": _to(("getSandbox", "killSandbox"), FROM_PATH)},
    "listSandboxes": {"200": _to(("getSandbox", "killSandbox"), "$response.body#/0/sandboxID")},
    "forkSandbox": {"201": _to(("getSandbox", "killSandbox"),
                               "$response.body#/0/sandbox/sandboxID")},  # fmt: skip
    "createSnapshot": {"201": {
        "deleteSnapshot": {"operationId": "deleteSnapshot",
                           "parameters": {"path.template_id": "$response.body#/snapshotID"}},
        "createSandboxFromSnapshot": {"operationId": "createSandboxV2",
                                      "requestBody": {"templateID": "$response.body#/snapshotID"}},
    }},  # fmt: skip
}


def add_links(doc: dict[str, Any]) -> None:
    """Put `LINKS` into an OpenAPI document's responses (in place)."""
    ops = {op["operationId"]: op for item in doc.get("paths", {}).values()
           for op in item.values() if isinstance(op, dict) and "operationId" in op}  # fmt: skip
    for source, by_status in LINKS.items():
        for status, links in by_status.items():
            for link in links.values():
                if link["operationId"] not in ops:
                    raise ValueError(f"link from {source} to unknown {link['operationId']}")
            ops[source]["responses"].setdefault(status, {"description": ""})["links"] = links
