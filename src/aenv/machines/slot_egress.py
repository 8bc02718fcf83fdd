"""A sandbox's egress as the runtime puts it on its slot (docs/runtime.md): the slot's
nftables sets, the slot's own listener for `egressProxy` and `network.rules`, the node's egress
proxy (domains in allowOut, the node's sandbox URLs from inside) and the CA that guests with
rules trust."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import httpx

from aenv.config import Config
from aenv.machines import guest_trust
from aenv.machines.api import AGENT_PORT
from aenv.network.egress import EgressPolicy, public_ranges
from aenv.network.egress_proxy import EgressProxy, hairpin_of
from aenv.network.intercept import Interceptor
from aenv.network.interception_ca import InterceptionCA, ca_paths, load_ca, upstream_context
from aenv.network.slot import Slot, set_egress
from aenv.network.tunnels import SlotListeners, needs_listener


class SlotEgress:
    def __init__(self, cfg: Config, secret: Callable[[str, str], Awaitable[str]]) -> None:
        self._network = cfg.slot_network
        self._public = public_ranges(cfg.network.public_ranges)  # egress: "internet" here
        # network.rules: TLS interception and request rewriting, by the slots' own listeners
        # and, for the node's sandbox URLs, by the egress proxy. `secret` is (team, name) ->
        # the value a rule injects.
        self.interceptor = Interceptor(lambda: load_ca(*ca_paths(cfg)), upstream_context(cfg),
                                       secret=secret)  # fmt: skip
        self.proxy = EgressProxy(hairpin=hairpin_of(cfg), interceptor=self.interceptor)
        self.tunnels = SlotListeners(self.interceptor)  # egressProxy (SOCKS5), network.rules

    async def start(self) -> None:
        _ = self.interceptor.ca  # made now, on the data filesystem, so a bad file fails start
        await self.proxy.start()

    async def close(self) -> None:
        await self.proxy.close()
        await self.tunnels.close()

    async def apply(self, slot: Slot, policy: EgressPolicy, *, fresh: bool) -> None:
        """`policy` onto `slot`. Raises OSError or RulesError (the slot keeps its rules)."""
        # The slot's listener exists before the rules name it, and closes after they stop.
        listener = (await self.tunnels.listen(slot.slot_addr, slot.netns_path)
                    if needs_listener(policy) else None)  # fmt: skip
        sets = await asyncio.to_thread(set_egress, slot, policy, self._network, self._public,
                                       fresh=fresh, proxy=self.proxy.ports,
                                       hairpin=self.proxy.hairpin is not None,
                                       listener=listener)  # fmt: skip
        self.proxy.admit(slot.slot_addr, policy, sets)
        self.tunnels.admit(slot.slot_addr, policy, sets)

    def forget(self, slot: Slot) -> None:
        """The slot is given back: its address stops being anyone's."""
        self.proxy.forget(slot.slot_addr)
        self.tunnels.forget(slot.slot_addr)

    async def trust(self, http: httpx.AsyncClient, slot: Slot, token: str | None) -> None:
        """The guest on `slot` trusts the CA (raises guest_trust.TrustError)."""
        await guest_trust.trust(http, slot.url(AGENT_PORT), token, self.interceptor.ca.pem)

    @property
    def ca(self) -> tuple[str, str]:
        """The CA's certificate and key (PEM)."""
        return self.interceptor.ca.pem, self.interceptor.ca.key_pem

    def use_ca(self, cert: str, key: str) -> None:
        if cert != self.interceptor.ca.pem:
            self.interceptor.ca = InterceptionCA(cert, key)
