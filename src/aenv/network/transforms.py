"""E2B's `network.rules`: per-domain transforms the egress proxy applies to a sandbox's
outbound HTTP and HTTPS requests, so far headers, whose values may name secrets:
`{"api.example.com": [{"transform": {"headers": {"Authorization": "Bearer ${e2b.secrets.key}"}}}]}`.

A placeholder `${e2b.secrets.<name>}` is resolved inside the proxy, per request, to the
secret's current value: the value never enters the sandbox. aenv's choices, documented:
- a rule's host is a domain or a `*.` wildcard (as in allowOut); an address has no name to
  intercept TLS for, so it is refused (400);
- an unknown secret in a rule is refused at create or update (400); one deleted later
  makes the matching requests fail (502) rather than go out without it;
- E2B's workload identity placeholders (`${e2b.identity.tokens.<name>}`) are refused (400).
A rule does not allow egress: the name must still be allowed (allowOut, or an open
destination).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from aenv.network.domains import DomainError, matches, parse_pattern
from aenv.teams.model import DEFAULT_TEAM

MAX_HOSTS = 64
MAX_HEADERS = 32
MAX_HEADER_VALUE = 8192
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")  # RFC 9110 field name
_PLACEHOLDER = re.compile(r"\$\{e2b\.([a-z]+)\.([^{}]*)\}")
# Hop-by-hop and framing headers a rule may not set: they would desynchronise the proxy.
_FORBIDDEN = {"host", "content-length", "transfer-encoding", "connection", "upgrade", "te",
              "trailer", "keep-alive", "proxy-connection"}


class TransformError(ValueError):
    """A rule this node cannot apply."""


@dataclass(frozen=True)
class Rule:
    pattern: str  # domains.py pattern
    headers: tuple[tuple[str, str], ...]  # in order; later rules of a host override
    # Whose secrets the placeholders name: the sandbox's team, set where the policy is
    # handed to the runtime (EgressPolicy.owned_by), never from a request.
    owner: str = DEFAULT_TEAM

    def secret_names(self) -> set[str]:
        return {m[2] for _, v in self.headers for m in _PLACEHOLDER.finditer(v)}


def parse_rules(body: object) -> tuple[Rule, ...]:
    """From E2B's `SandboxNetworkConfigRules`; raises TransformError."""
    if body is None:
        return ()
    if not isinstance(body, Mapping):
        raise TransformError("network.rules must map hosts to lists of rules")
    if len(body) > MAX_HOSTS:
        raise TransformError(f"network.rules holds at most {MAX_HOSTS} hosts")
    out = []
    for host, rules in body.items():
        try:
            pattern = parse_pattern(host)
        except DomainError as e:
            raise TransformError(f"network.rules: {e} (rules are by domain name: TLS is "
                                 "intercepted by name)") from None
        if not isinstance(rules, list):
            raise TransformError(f"network.rules[{host!r}] must be a list of rules")
        headers: dict[str, tuple[str, str]] = {}
        for rule in rules:
            transform = rule.get("transform") if isinstance(rule, Mapping) else None
            extra = set(rule) - {"transform"} if isinstance(rule, Mapping) else {"?"}
            if extra:
                raise TransformError(f"network.rules[{host!r}]: a rule holds a transform only")
            for k, v in _headers(host, transform):
                headers[k.lower()] = (k, v)
        out.append(Rule(pattern, tuple(headers.values())))
    return tuple(out)


def _headers(host: str, transform: object) -> list[tuple[str, str]]:
    if transform is None:
        return []
    if not isinstance(transform, Mapping) or set(transform) - {"headers"}:
        raise TransformError(f"network.rules[{host!r}]: a transform holds headers only")
    headers = transform.get("headers") or {}
    if not isinstance(headers, Mapping) or len(headers) > MAX_HEADERS:
        raise TransformError(f"network.rules[{host!r}]: headers must map at most "
                             f"{MAX_HEADERS} names to values")
    out = []
    for k, v in headers.items():
        if not isinstance(k, str) or not _TOKEN.match(k) or k.lower() in _FORBIDDEN:
            raise TransformError(f"network.rules[{host!r}]: {k!r} is not a header a rule "
                                 "may set")
        if not isinstance(v, str) or len(v) > MAX_HEADER_VALUE or any(c in v for c in "\r\n\0"):
            raise TransformError(f"network.rules[{host!r}]: the value of {k!r} must be a "
                                 f"single-line string of at most {MAX_HEADER_VALUE} characters")
        for m in _PLACEHOLDER.finditer(v):
            if m[1] == "identity":
                raise TransformError(f"network.rules[{host!r}]: workload identity tokens "
                                     "(${e2b.identity.tokens.*}) are not supported")
            if m[1] != "secrets" or not m[2]:
                raise TransformError(f"network.rules[{host!r}]: {m[0]!r} is not a placeholder "
                                     "this node resolves (${e2b.secrets.<name>})")
        out.append((k, v))
    return out


def rule_for(rules: tuple[Rule, ...], name: str) -> Rule | None:
    """The rule for `name`: an exact host first, else the first matching wildcard."""
    exact = [r for r in rules if r.pattern == name]
    if exact:
        return exact[0]
    return next((r for r in rules if matches(name, (r.pattern,))), None)


def resolve(rule: Rule, secret: Callable[[str], str]) -> list[tuple[str, str]]:
    """The rule's headers with their placeholders filled; `secret(name)` raises KeyError
    (or the store's not-found error) for an unknown one."""
    return [(k, _PLACEHOLDER.sub(lambda m: secret(m[2]), v)) for k, v in rule.headers]


def to_json(rules: tuple[Rule, ...]) -> dict[str, list[dict[str, object]]]:
    """As E2B reports and takes them (placeholders, never values)."""
    return {r.pattern: [{"transform": {"headers": dict(r.headers)}}] for r in rules}
