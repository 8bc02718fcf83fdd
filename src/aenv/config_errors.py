"""What a bad setting says: one line naming the setting, its value (never a secret's) and the rule.

`aenv.config.load` raises `ConfigError` for a value its model refuses, a TOML file that does not
parse and a file that cannot be read; the CLI prints it as `aenv: <message>` and exits 2 before
anything starts. A setting is named as the user set it: its environment variable
(`AENV_INSTANCE`), a command-line flag (`--port`), or its TOML key and the file
(`cluster.prefix in /etc/aenv/config.toml`). This module imports nothing heavy: the CLI
imports it for every command.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

Loc = tuple[str | int, ...]

# A setting whose last name part reads like this holds a secret: its value is never shown.
_SECRET = re.compile(r"(?:^|_)(?:key|tokens?|password|passwd|secret|credentials?)$", re.I)
_USERINFO = re.compile(r"(://)[^/@\s'\"]+@")  # http://user:pass@host: credentials in a URL
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_MAX_VALUE = 80
HIDDEN = "(value hidden)"


class ConfigError(ValueError):
    """A bad configuration: `str(e)` is one line to show as it is (no traceback)."""


def is_secret(loc: Sequence[str | int]) -> bool:
    """Whether a setting (or anything inside it) holds a secret: api_key, cluster.token..."""
    return any(isinstance(part, str) and _SECRET.search(part) for part in loc)


def toml_key(loc: Sequence[str | int]) -> str:
    """`("cluster", "prefix")` -> `cluster.prefix`; list items as `[i]`."""
    key = ""
    for part in loc:
        if isinstance(part, int):
            key += f"[{part}]"
        else:
            name = part if _BARE_KEY.match(part) else '"' + part.replace('"', '\\"') + '"'
            key += ("." if key else "") + name
    return key


def show_value(value: object, secret: bool) -> str:
    """A value as the message shows it: quoted, on one line, short, credentials hidden."""
    if secret:
        return HIDDEN
    text = _USERINFO.sub(r"\1(hidden)@", repr(value))
    return text if len(text) <= _MAX_VALUE else text[: _MAX_VALUE - 3] + "..."


# pydantic's error types, as the rule a value broke.
_RULES = {
    "string_pattern_mismatch": "must match {pattern}",
    "greater_than_equal": "must be at least {ge}",
    "greater_than": "must be more than {gt}",
    "less_than_equal": "must be at most {le}",
    "less_than": "must be less than {lt}",
    "multiple_of": "must be a multiple of {multiple_of}",
    "literal_error": "must be one of {expected}",
    "enum": "must be one of {expected}",
    "int_parsing": "must be an integer",
    "int_type": "must be an integer",
    "int_from_float": "must be a whole number",
    "float_parsing": "must be a number",
    "float_type": "must be a number",
    "finite_number": "must be a finite number",
    "bool_parsing": "must be true or false",
    "bool_type": "must be true or false",
    "string_type": "must be a string",
    "string_too_short": "must be at least {min_length} characters",
    "string_too_long": "must be at most {max_length} characters",
    "list_type": "must be a list (an array in TOML)",
    "dict_type": "must be a table",
    "model_type": "must be a table",
    "model_attributes_type": "must be a table",
    "path_type": "must be a path",
    "missing": "must be set",
    "extra_forbidden": "is not a setting",
}


def rule(error: Mapping[str, Any], key: str = "") -> str:
    """The rule of one pydantic error, worded for a person ("must match ^[a-z]+$")."""
    ctx = {k: int(v) if isinstance(v, float) and v.is_integer() else v  # "0", not "0.0"
           for k, v in (error.get("ctx") or {}).items()}
    template = _RULES.get(error["type"])
    if template is not None:
        try:
            return template.format(**ctx)
        except (KeyError, IndexError):
            pass
    text = str(error.get("msg", "is not valid"))
    text = text.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if key and text.startswith(key + ": "):  # the validator named the setting already
        text = text[len(key) + 2 :]
    return re.sub(r"^(Input|String|List|Value) should", "must", text)


def _lookup(data: Mapping[str, Any], loc: Sequence[str | int]) -> tuple[bool, object]:
    """(found, value) of `loc` in the raw settings."""
    value: Any = data
    for part in loc:
        try:
            value = value[part]
        except (KeyError, IndexError, TypeError):
            return False, None
    return True, value


class Explainer:
    """Names settings as the user set them: `sources` maps a setting (or a table of them) to
    the env var or flag it came from; anything else in `data` came from `file`; `env_names`
    names settings nobody set (for rules about several settings)."""

    def __init__(self, data: Mapping[str, Any], sources: Mapping[Loc, str],
                 env_names: Mapping[Loc, str], file: Path | None) -> None:  # fmt: skip
        self.data, self.sources, self.env_names, self.file = data, sources, env_names, file

    def name(self, loc: Loc) -> str:
        for i in range(len(loc), 0, -1):
            if loc[:i] in self.sources:
                return self.sources[loc[:i]]
        found, _ = _lookup(self.data, loc)
        if not found:  # nobody set it: its usual name
            return self.env_names.get(loc) or toml_key(loc)
        return f"{toml_key(loc)} in {self.file}" if self.file else toml_key(loc)

    def line(self, error: Mapping[str, Any]) -> str:
        loc: Loc = tuple(error.get("loc") or ())
        fields = (error.get("ctx") or {}).get("fields")
        if fields:  # a rule about several settings (a model validator's, maybe a section's)
            return self._together(error, [loc + tuple(f.split(".")) for f in fields])
        secret = is_secret(loc)
        why = rule(error, toml_key(loc))
        if secret and isinstance(error.get("input"), str) and error["input"]:
            why = why.replace(error["input"], HIDDEN)  # a validator that echoed it
        name = self.name(loc) if loc else "configuration"
        value = show_value(error.get("input"), secret)
        if not loc:
            return f"{name}: {why}"
        return f"{name}: {value} {why}" if why.startswith("must ") else f"{name}: {value}: {why}"

    def _together(self, error: Mapping[str, Any], locs: list[Loc]) -> str:
        parts = []
        for loc in locs:
            found, value = _lookup(self.data, loc)
            shown = show_value(value, is_secret(loc)) if found and value is not None else "not set"
            parts.append(f"{self.name(loc)} ({shown})")
        return f"{' and '.join(parts)}: {rule(error)}"

    def explain(self, errors: Sequence[Mapping[str, Any]]) -> ConfigError:
        """One ConfigError for all of a ValidationError's `errors()`: one line, '; '-joined."""
        lines: list[str] = []
        for error in errors:
            text = " ".join(self.line(error).split())
            if text not in lines:
                lines.append(text)
        return ConfigError("; ".join(lines) or "invalid configuration")
