"""Errors the orchestrator raises; the API maps each class to one HTTP status in one table.

    OrchestratorError                 (500, terminal for the call)
    ├── NotFound                      (404) no sandbox/template by that id
    ├── InvalidRequest                (400) the caller asked for something malformed
    ├── Unsupported                   (400) a valid E2B option this node cannot honour yet
    ├── StateConflict                 (409) the sandbox is not in a state the call accepts
    ├── CapacityExhausted             (429) over max_sandboxes / max_concurrent_boots; retry later
    ├── Forbidden                     (403) the team sees it but may not change it
    ├── TeamLimitReached              (429) the caller's team is at its own limit; no retry
    ├── SpaceExhausted                (507) the data filesystem lacks room for the reserve
    └── ShuttingDown                  (503) the node stopped accepting work

Runtime failures (`aenv.machines.api.RuntimeError_` and subclasses) pass through
unchanged; they carry their own `status`, and some an E2B `error_code` for the body (e.g.
`runtime.UnusableSnapshot`: 409 "snapshot_corrupt", a restore refused by an integrity check).
"""

from __future__ import annotations


class OrchestratorError(Exception):
    status = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NotFound(OrchestratorError):
    status = 404


class InvalidRequest(OrchestratorError):
    status = 400


class Unsupported(OrchestratorError):
    status = 400


class StateConflict(OrchestratorError):
    status = 409

    def __init__(self, message: str, *, expected: tuple[str, ...] = (), actual: str = "") -> None:
        super().__init__(message)
        self.expected = expected
        self.actual = actual


class CapacityExhausted(OrchestratorError):
    status = 429

    def __init__(self, message: str, *, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Forbidden(OrchestratorError):
    """The caller's team sees it but may not change it (a public template)."""

    status = 403


class TeamLimitReached(OrchestratorError):
    """The team runs as much as its limits allow: waiting does not help, stopping its own
    sandboxes or a higher limit does (answered with `Should-Retry: false`)."""

    status = 429


class SpaceExhausted(OrchestratorError):
    status = 507


class ShuttingDown(OrchestratorError):
    status = 503


class Unavailable(OrchestratorError):
    """What the call needs is out of reach for now (the cluster's etcd): retryable."""

    status = 503
