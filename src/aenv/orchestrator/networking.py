"""A sandbox's egress policy: made from a create's request against the node's defaults, and
replaced live (E2B's `PUT /sandboxes/{id}/network`).

An update replaces the whole policy, as E2B's does: a field it leaves out goes back to its
default. A running or hot-paused sandbox gets it on its slot at once, connections already
open included (`network/rules.py`); a cold-paused one keeps it in its record, and its resume
applies it, as every start does. Forks inherit it; a snapshot does not carry it (a create
from one names its own).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from aenv.network.egress import (
    EgressPolicy,
    EgressPolicyError,
    check_egress_proxy,
    public_ranges,
)
from aenv.network.rules import RulesError
from aenv.obs import log_event
from aenv.orchestrator.errors import InvalidRequest, StateConflict, Unavailable
from aenv.orchestrator.requests import CreateRequest, new_access_token
from aenv.orchestrator.routes import Ingress, IngressError
from aenv.orchestrator.states import SandboxState
from aenv.orchestrator.store import SandboxRecord
from aenv.secrets.store import SecretNotFound

log = logging.getLogger("aenv.orchestrator")
S = SandboxState


class Networking:
    """Part of `Orchestrator` (orchestrator/service.py), whose state it uses."""

    def egress_for(self, allow_internet: bool | None, allow_out: Sequence[object] = (),
                   deny_out: Sequence[object] = (), dns_servers: Sequence[object] | None = None,
                   egress_proxy: object | None = None, rules: object | None = None
                   ) -> EgressPolicy:  # fmt: skip
        """The policy a request asks for; public destinations follow the node's default
        unless it says. InvalidRequest on entries this node cannot enforce."""
        internet = (self.config.network.internet_by_default if allow_internet is None
                    else allow_internet)  # fmt: skip
        try:
            return EgressPolicy.from_request(internet, allow_out, deny_out, dns_servers,
                                             egress_proxy, rules)  # fmt: skip
        except EgressPolicyError as e:
            raise InvalidRequest(str(e)) from None

    async def check_egress(self, policy: EgressPolicy, team_id: str) -> None:
        """InvalidRequest if the egressProxy does not resolve, or resolves inside, or a rule
        names a secret that does not exist (aenv's choice: E2B would fail at the request)."""
        for rule in policy.rules:
            for name in sorted(rule.secret_names()):
                try:
                    assert self.secrets is not None
                    await self.secrets.get(team_id, name)
                except SecretNotFound:
                    raise InvalidRequest(f"network.rules[{rule.pattern!r}]: secret {name!r} "
                                         "does not exist") from None
        try:
            await check_egress_proxy(policy, public_ranges(self.config.network.public_ranges))
        except EgressPolicyError as e:
            raise InvalidRequest(str(e)) from None

    def ingress_for(self, req: CreateRequest) -> Ingress:
        """How a new sandbox's ports are reached; InvalidRequest on options that are not
        valid."""
        token = new_access_token() if req.allow_public_traffic is False else None
        try:
            return Ingress.from_request(token, req.mask_request_host, req.https_ports)
        except IngressError as e:
            raise InvalidRequest(str(e)) from None

    async def update_network(self, sandbox_id: str, allow_internet: bool | None,
                             allow_out: Sequence[object] = (), deny_out: Sequence[object] = (),
                             dns_servers: Sequence[object] | None = None,
                             egress_proxy: object | None = None, rules: object | None = None
                             ) -> SandboxRecord:  # fmt: skip
        """Replace a running or paused sandbox's egress policy (see the module docstring)."""
        policy = self.egress_for(allow_internet, allow_out, deny_out, dns_servers, egress_proxy,
                                 rules)  # fmt: skip
        await self.check_egress(policy, self.get(sandbox_id).team_id)  # NotFound
        async with self._locks.hold(sandbox_id):
            rec = self.get(sandbox_id)  # NotFound
            if rec.state not in (S.RUNNING, S.PAUSED):
                raise StateConflict(f"sandbox {sandbox_id} is {rec.state}", actual=str(rec.state))
            # The slot first: were the node to die before the record, the slot (which a
            # re-adopted VM keeps) holds the newer, and a caller that saw no answer retries.
            try:
                live = await self.runtime.set_egress(sandbox_id, policy.owned_by(rec.team_id))
            except (OSError, RulesError) as e:
                raise Unavailable(f"the network update could not be applied: {e}") from e
            if not self.store.set_egress(sandbox_id, [rec.state], policy, allow_internet,
                                         self.now_us()):  # fmt: skip
                raise StateConflict(f"sandbox {sandbox_id} changed during the update")
            if rec.state is S.PAUSED and self.shared is not None:
                self.shared.updated(self.get(sandbox_id))
        log_event(log, "sandbox.network_updated", sandbox_id=sandbox_id, live=live,
                  internet=policy.internet, allow_out=len(policy.allow_out),
                  deny_out=len(policy.deny_out))  # fmt: skip
        return self.get(sandbox_id)
