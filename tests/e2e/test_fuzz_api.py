"""Schemathesis drives the node's served OpenAPI document against a capped node booting real VMs.

A fixed budget (`POSITIVE` + `NEGATIVE` examples per operation, about 300 in all) with a
derandomized seed. Every response must be documented (status, content type, headers, body
schema) and no response may be a 5xx except 507 (out of disk). Invalid input
must be rejected, valid input accepted (404 for ids that name nothing, 429 at capacity).

To reach past the 404s, some cases get a real sandbox id in the path and some creates the
`base` template; whatever a case makes (sandboxes, forks, snapshots) is removed right after
it, and nothing of it is left at the end. Besides, every control-plane operation answers
401 without the key or with a wrong one.

A stateful run follows the document's OpenAPI links (create -> get/pause/fork/snapshot/...,
pause -> resume/connect, snapshot -> delete/create-from) for `STATEFUL_SCENARIOS` sequences of
up to `STATEFUL_STEPS` calls, with the same checks (`ignored_auth` replays every 2xx call
without the key and with a wrong one: both must be 401); each sequence ends with everything
it made removed. The test prints how many requests each run made.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.core import NOT_SET
from schemathesis.core.failures import ServerError
from schemathesis.specs.openapi import checks as oa

from .conftest import API_KEY, NodeProcess, running_node

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

POSITIVE = 10  # examples per operation and mode; ~20 operations -> ~300 requests
NEGATIVE = 5
STATEFUL_SCENARIOS = 20  # hypothesis examples: call sequences from a root operation
STATEFUL_STEPS = 8  # calls per sequence at most (hypothesis' stateful_step_count)
# Create fields a stateful sequence keeps (shape and unsupported options are the stateless
# run's business: they end a sequence at its first call).
STATEFUL_CREATE_KEYS = {"templateID", "timeout", "metadata", "envVars", "autoPause", "secure"}
PUBLIC = {"/health", "/metrics", "/openapi.json"}
# SandboxFusion's run_code: verl's client sends no key, the token in the path is the
# credential (no security scheme says "in the path"); it answers 401 without one all the same.
PATH_TOKEN = {"/rl/run_code/{token}"}
# Volume content (raw file bodies behind a volume's token) is not fuzzed: with its bearer
# scheme the fuzzer sends header values uvicorn's parser refuses before the app (a text/plain
# 400 it calls undocumented). tests/unit/api/test_volumes.py covers it, escapes included;
# the key check below still covers it.
CONTENT = "/volumecontent/"
# The console's own reads and builds link to no sandbox: the stateless run fuzzes them; the
# stateful one spends its sequences on the operations links join.
CONSOLE = "/overview$|/v3/templates/dockerfile$"
# Nor the admin API: what it changes outlives a sequence (a team's limits, which the stateless
# run may set on the node's own team, would refuse later creates), and hypothesis needs every
# sequence to start from the same node. tests/unit/api/test_teams.py covers it, bad input
# included; the key check below still covers it.
ADMIN = "/admin/"
CREATES = {"/v2/sandboxes", "/sandboxes"}
ALLOWED_5XX = {507}  # no route answers 501 any more: one would be a failure
SID = re.compile(r"^[a-z0-9]{20}$")


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    with running_node(
        tmp_path_factory.mktemp("fuzz"), AENV_MAX_SANDBOXES="2", AENV_MAX_CONCURRENT_BOOTS="1"
    ) as n:
        yield n


@schemathesis.check
def no_server_error(ctx: Any, response: Any, case: Any) -> bool | None:
    """Schemathesis' `not_a_server_error`, minus the 5xx this node documents on purpose."""
    status = response.status_code
    if status >= 500 and status not in ALLOWED_5XX:
        raise ServerError(operation=case.operation.label, status_code=status)
    return None


CONFIG = schemathesis.Config.from_dict({
    "checks": {
        "not_a_server_error": {"enabled": False},  # replaced by no_server_error
        # Schema-valid data may still name nothing (404), meet the capacity cap (429) or a
        # create option the node refuses until the feature exists (documented 400).
        "positive_data_acceptance": {
            "expected-statuses": ["2xx", "400", "401", "404", "409", "429", "5xx"],
        },
    },
})  # fmt: skip
CHECKS = [
    no_server_error,
    oa.status_code_conformance,
    oa.content_type_conformance,
    oa.response_headers_conformance,
    oa.response_schema_conformance,
    oa.negative_data_rejection,
    oa.positive_data_acceptance,
    oa.ignored_auth,
]


def _checks(case: Any) -> list[Any]:
    """CHECKS, less `negative_data_rejection` for a negative case that ended up omitting an
    optional body: that request is valid, whatever schemathesis mutated it from (it flagged a
    real sandbox's bodyless `connect`/`refreshes` answering 2xx)."""
    raw = case.operation.definition.raw
    if (case.meta.generation.mode.is_negative and case.body is NOT_SET
            and "requestBody" in raw and not raw["requestBody"].get("required")):  # fmt: skip
        return [c for c in CHECKS if c is not oa.negative_data_rejection]
    return CHECKS


class Sandboxes:
    """One running sandbox whose id the fuzzer may put in paths, recreated (a bounded number of
    times) when the fuzzer killed or paused it; and cleanup of whatever the fuzzer made."""

    MAX_CREATES = 8

    def __init__(self, api: httpx.Client) -> None:
        self.api = api
        self.current: str | None = None
        self.created: set[str] = set()  # every sandbox id seen in a response, to clean up
        self.snapshots: set[str] = set()  # every snapshot id seen in a response
        self.creates = 0
        self.statuses: Counter[tuple[str, int]] = Counter()  # (operation, status) -> count

    def live_id(self) -> str | None:
        if self.current:
            r = self.api.get(f"/sandboxes/{self.current}")
            if r.status_code == 200 and r.json()["state"] == "running":
                return self.current
            self.api.delete(f"/sandboxes/{self.current}")
            self.current = None
        if self.creates >= self.MAX_CREATES:
            return None
        self.creates += 1
        r = self.api.post("/v2/sandboxes", json={"templateID": "base", "timeout": 300})
        if r.status_code != 201:
            assert r.status_code in (429, 507), r.text
            return None
        self.current = r.json()["sandboxID"]
        self.created.add(self.current)
        return self.current

    def remember(self, op: Any, response: Any) -> tuple[set[str], set[str]]:
        """The sandbox and snapshot ids a successful POST made (create, fork, snapshot); the
        sandboxes are kept in `created` for the final check."""
        if op.method.upper() != "POST" or not 200 <= response.status_code < 300:
            return set(), set()
        try:
            doc = response.json()
        except ValueError:
            return set(), set()
        sids, snaps = set(), set()
        for key, value in _walk(doc):
            if key == "sandboxID" and isinstance(value, str) and SID.match(value):
                sids.add(value)
            elif key == "snapshotID" and isinstance(value, str):
                snaps.add(value)
        self.created |= sids
        self.snapshots |= snaps
        return sids, snaps

    def clean_after(self, op: Any, response: Any) -> None:
        """Kill the sandboxes and delete the snapshots a successful POST made, so that the next
        case finds capacity."""
        sids, snaps = self.remember(op, response)
        for value in sids - {self.current}:
            assert self.api.delete(f"/sandboxes/{value}").status_code in (204, 404)
        for value in snaps:
            assert self.api.delete(f"/templates/{value}").status_code in (204, 404)

    def kill_all(self) -> None:
        """The node as a sequence found it: no sandboxes, snapshots, secrets or volumes
        (hypothesis replays a sequence's choices, and listings feed its next draws)."""
        for s in self.api.get("/v2/sandboxes").json():
            self.api.delete(f"/sandboxes/{s['sandboxID']}")
        self.current = None
        for s in self.api.get("/secrets").json():
            assert self.api.delete(f"/secrets/{s['secretID']}").status_code in (204, 404)
        for v in self.api.get("/volumes").json():
            assert self.api.delete(f"/volumes/{v['volumeID']}").status_code in (204, 404)
        for snap in self.snapshots:
            assert self.api.delete(f"/templates/{snap}").status_code in (204, 404)
        for sid in self.created:
            r = self.api.get("/snapshots", params={"sandboxID": sid})
            for snap in r.json() if r.status_code == 200 else []:
                self.api.delete(f"/templates/{snap['snapshotID']}")

    def snapshots_left(self) -> list[Any]:
        left = []
        for sid in self.created:
            r = self.api.get("/snapshots", params={"sandboxID": sid})
            assert r.status_code == 200, r.text
            left += r.json()
        return left


def _walk(doc: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield k, v
            yield from _walk(v)
    elif isinstance(doc, list):
        for v in doc:
            yield from _walk(v)


@pytest.fixture(scope="module")
def sandboxes(capped: NodeProcess) -> Iterator[Sandboxes]:
    with capped.api() as api:
        pool = Sandboxes(api)
        try:
            yield pool
        finally:
            pool.kill_all()


def _operations(node: NodeProcess) -> list[Any]:
    schema = schemathesis.openapi.from_url(node.origin + "/openapi.json", config=CONFIG)
    ops = [r.ok() for r in schema.get_all_operations()]
    assert len(ops) >= 15, [op.label for op in ops]
    return ops


def _fuzz(op: Any, mode: GenerationMode, n: int, pool: Sandboxes, origin: str) -> None:
    kwargs: dict[str, Any] = {}
    if mode.is_negative and op.path_parameters:
        # A string path parameter can't be made invalid, and schemathesis rejects every
        # negative case that tries: fix the path, negate the body and query.
        sid = pool.live_id() or "a" * 20
        kwargs["path_parameters"] = {p.name: sid if p.name == "sandbox_id" else "base"
                                     for p in op.path_parameters}  # fmt: skip

    @settings(
        max_examples=n, derandomize=True, database=None, deadline=None,
        phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck),
    )  # fmt: skip
    @given(case=op.as_strategy(generation_mode=mode, **kwargs), real_id=st.booleans(),
           base=st.booleans())  # fmt: skip
    def run(case: Any, real_id: bool, base: bool) -> None:
        if real_id and "sandbox_id" in (case.path_parameters or {}):
            sid = pool.live_id()
            if sid is not None:
                case.path_parameters = {**case.path_parameters, "sandbox_id": sid}
        if base and op.path in CREATES and isinstance(case.body, dict) and mode.is_positive:
            case.body = {**case.body, "templateID": "base"}
        kw: dict[str, Any] = {"base_url": origin, "headers": {"X-API-Key": API_KEY},
                              "timeout": 120}  # fmt: skip
        response = case.call(**kw)
        try:
            case.validate_response(response, checks=_checks(case), headers=kw["headers"],
                                   transport_kwargs=kw)  # fmt: skip
        finally:
            pool.statuses[(op.label, response.status_code)] += 1
            pool.clean_after(op, response)

    run()


def _negatable(op: Any) -> bool:
    """Negative data needs a body or a typed query parameter (a string path can't be wrong)."""
    raw = op.definition.raw
    params = [p for p in raw.get("parameters", []) if p.get("in") != "path"]
    return "requestBody" in raw or bool(params)


def test_fuzz_openapi(capped: NodeProcess, sandboxes: Sandboxes) -> None:
    failures: list[str] = []
    for op in _operations(capped):
        if op.path.startswith((CONTENT, ADMIN)):
            continue
        modes = [(GenerationMode.POSITIVE, POSITIVE)]
        if _negatable(op):
            modes.append((GenerationMode.NEGATIVE, NEGATIVE))
        for mode, n in modes:
            try:
                _fuzz(op, mode, n, sandboxes, capped.origin)
            except (Exception, BaseExceptionGroup) as e:  # FailureGroup is a BaseExceptionGroup
                failures.append(f"{op.label} [{mode.value}]: {e}")
    sandboxes.kill_all()
    for (label, status), count in sorted(sandboxes.statuses.items()):
        print(f"{count:4d} x {status} {label}")
    print(f"stateless: {sandboxes.statuses.total()} requests")
    assert not failures, "\n\n".join(failures)
    assert sandboxes.statuses.total() >= 250, sandboxes.statuses.total()
    assert sandboxes.created, "the fuzzer never reached a real sandbox"
    assert sandboxes.snapshots_left() == []


@pytest.mark.long  # ~35 s; CI fuzzes each operation on its own
def test_fuzz_openapi_stateful(capped: NodeProcess, sandboxes: Sandboxes) -> None:
    schema = schemathesis.openapi.from_url(capped.origin + "/openapi.json", config=CONFIG
                                           ).exclude(path_regex=f"^({CONTENT}|{ADMIN}|{CONSOLE})")
    steps: Counter[tuple[str, int]] = Counter()
    kwargs: dict[str, Any] = {"base_url": capped.origin, "headers": {"X-API-Key": API_KEY},
                              "timeout": 120}  # fmt: skip

    class Workflow(schema.as_state_machine()):  # type: ignore[misc]
        def before_call(self, case: Any) -> None:
            # A positive create gets a template that exists (or keeps the snapshot a link put
            # there) and no option this node refuses: sequences must get past their create.
            body = case.body
            if (case.operation.path in CREATES and isinstance(body, dict)
                    and case.meta.generation.mode.is_positive):  # fmt: skip
                keep = {k: v for k, v in body.items() if k in STATEFUL_CREATE_KEYS}
                if keep.get("templateID") not in sandboxes.snapshots:
                    keep["templateID"] = "base"
                case.body = keep

        def get_call_kwargs(self, case: Any) -> dict[str, Any]:
            return kwargs

        def validate_response(self, response: Any, case: Any, additional_checks: Any = None,
                              **kw: Any) -> None:  # fmt: skip
            steps[(case.operation.label, response.status_code)] += 1
            try:
                case.validate_response(response, checks=_checks(case),
                                       headers=kwargs["headers"], transport_kwargs=kw)  # fmt: skip
            finally:
                sandboxes.remember(case.operation, response)

        def teardown(self) -> None:
            sandboxes.kill_all()  # every sequence starts with the node empty (it is capped)

    Workflow.run(settings=settings(
        max_examples=STATEFUL_SCENARIOS, stateful_step_count=STATEFUL_STEPS, derandomize=True,
        database=None, deadline=None, phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    ))  # fmt: skip
    for (label, status), count in sorted(steps.items()):
        print(f"{count:4d} x {status} {label}")
    linked = {label for (label, status) in steps if "{" in label and status < 300}
    auth_probes = 2 * sum(c for (label, status), c in steps.items()
                          if 200 <= status < 300 and label.split()[1] not in PUBLIC)  # fmt: skip
    print(f"stateful: {steps.total()} calls in {STATEFUL_SCENARIOS} sequences, "
          f"{auth_probes} auth-bypass probes (all 401)")
    # The links took sequences past create: real ids reached operations on one sandbox.
    assert len(linked) >= 4, sorted(steps)
    assert sandboxes.snapshots_left() == []


def test_every_control_plane_operation_needs_the_key(capped: NodeProcess) -> None:
    ops = _operations(capped)
    guarded = [op for op in ops if op.path not in PUBLIC]
    assert {op.path for op in ops} - {op.path for op in guarded} <= PUBLIC
    assert all(op.definition.raw.get("security") for op in guarded if op.path not in PATH_TOKEN)
    assert {op.path for op in guarded} >= PATH_TOKEN
    with httpx.Client(base_url=capped.origin, timeout=30) as c:
        for op in guarded:
            path = op.path.replace("{sandbox_id}", "a" * 20).replace("{template_id}", "base")
            path = path.replace("{alias}", "base")
            body = {"templateID": "base"} if op.method.upper() == "POST" else None
            for headers in ({}, {"X-API-Key": "wrong"}, {"X-API-Key": ""}):
                r = c.request(op.method.upper(), path, json=body, headers=headers)
                assert r.status_code == 401, (op.label, headers, r.status_code, r.text)
                assert r.json() == {"code": 401, "message": r.json()["message"]}
        assert c.get("/v2/sandboxes", headers={"X-API-Key": API_KEY}).json() == []
