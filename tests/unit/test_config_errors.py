"""A bad setting is one line (docs/config.md, "A bad value"): it names the setting (its env var,
or its TOML key and the file), the value (never a secret's) and the rule; `aenv server`,
`aenv gateway` and the CLI print it as `aenv: ...` and exit 2 before anything starts.

The table of bad values is derived from the models' own constraints (ge/gt/le/lt, patterns,
Literals, validators), so a constraint added later is covered without a new test; a new
validator must add its bad value to VALIDATED (the test says so).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import annotated_types
import pytest
from pydantic import BaseModel, Field, field_validator

from aenv import config
from aenv.config_errors import HIDDEN, ConfigError, Explainer, is_secret, toml_key

Loc = tuple[str, ...]

# Validators that refuse values: a bad value and what the message says about it.
VALIDATED: dict[Loc, tuple[Any, str]] = {
    ("faults",): ("nowhere", "unknown fault point 'nowhere'"),
    ("network", "public_ranges"): (["1.2.3.0/24"], "is not inside a special range"),
}
NORMALIZERS = {"_absolute"}  # validators that refuse nothing (they make paths absolute)
NOISE = ("pydantic", "ValidationError", "internal error", "errors.pydantic.dev", "Traceback")


def _models(model: type[BaseModel] = config.Config, prefix: Loc = ()) -> list[tuple[Loc, type]]:
    """Config and every model nested in it, with the TOML table each is at."""
    found: list[tuple[Loc, type]] = [(prefix, model)]
    for name, field in model.model_fields.items():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            found += _models(field.annotation, (*prefix, name))
    return found


def _fields() -> list[tuple[Loc, Any]]:
    return [((*table, name), field) for table, model in _models()
            for name, field in model.model_fields.items()]  # fmt: skip


def _not_matching(pattern: str) -> str:
    for candidate in ("no-slashes", "Bad Value!", "", "/x/y/" + "z" * 300):
        if not re.search(pattern, candidate):
            return candidate
    raise AssertionError(f"no bad value for pattern {pattern}")


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


@dataclass(frozen=True)
class Bad:
    loc: Loc
    value: Any
    rule: str  # a part of the message that states the rule

    def __str__(self) -> str:
        return f"{toml_key(self.loc)}={self.value!r}"


def _bad_values() -> list[Bad]:
    """One bad value per constraint of every setting, from the models' own metadata."""
    bad: list[Bad] = []
    for loc, field in _fields():
        step = 1 if field.annotation is int else 0.5
        for m in field.metadata:
            if isinstance(m, annotated_types.Ge):
                bad.append(Bad(loc, m.ge - step, f"must be at least {_num(m.ge)}"))
            elif isinstance(m, annotated_types.Gt):
                bad.append(Bad(loc, m.gt, f"must be more than {_num(m.gt)}"))
            elif isinstance(m, annotated_types.Le):
                bad.append(Bad(loc, m.le + step, f"must be at most {_num(m.le)}"))
            elif isinstance(m, annotated_types.Lt):
                bad.append(Bad(loc, m.lt, f"must be less than {_num(m.lt)}"))
            elif getattr(m, "pattern", None):
                bad.append(Bad(loc, _not_matching(m.pattern), f"must match {m.pattern}"))
        if typing.get_origin(field.annotation) is typing.Literal:
            choices = typing.get_args(field.annotation)
            bad.append(Bad(loc, "no-such-choice", "must be one of " + repr(choices[0])))
    for table, model in _models():
        for name, dec in model.__pydantic_decorators__.field_validators.items():
            if name in NORMALIZERS:
                continue
            for f in dec.info.fields:
                loc = (*table, f)
                assert loc in VALIDATED, f"{model.__name__}.{name} refuses values: add a bad " \
                    f"value for {toml_key(loc)} to VALIDATED"  # fmt: skip
                bad.append(Bad(loc, *VALIDATED[loc]))
    return bad


BAD = _bad_values()


def _toml(loc: Loc, value: Any) -> str:
    *tables, key = loc
    return (f"[{'.'.join(tables)}]\n" if tables else "") + f"{key} = {json.dumps(value)}\n"


def _env_text(value: Any) -> str:
    return ",".join(value) if isinstance(value, list) else str(value)


def _error(*args: Any, **kwargs: Any) -> str:
    with pytest.raises(ConfigError) as e:
        config.load(*args, **kwargs)
    text = str(e.value)
    assert "\n" not in text and text.strip() == text, text
    assert not any(n in text for n in NOISE), text
    return text


def test_the_table_covers_the_constraints_we_know_of() -> None:
    locs = {b.loc for b in BAD}
    assert {("instance",), ("cluster", "prefix"), ("store", "url"), ("default_shape", "vcpus"),
            ("accel",), ("on_shutdown",), ("runtime",), ("hot_psi_avg10",), ("faults",),
            ("network", "public_ranges")} <= locs  # fmt: skip
    assert len(BAD) > 40


@pytest.mark.parametrize("bad", [b for b in BAD if b.loc in config.ENV_NAMES], ids=str)
def test_a_bad_env_value_names_the_variable_the_value_and_the_rule(bad: Bad) -> None:
    var, text_value = config.ENV_NAMES[bad.loc], _env_text(bad.value)
    text = _error(env={var: text_value})
    assert text.startswith(f"{var}: "), text
    assert bad.rule in text, text
    shown = repr(bad.value) if isinstance(bad.value, list) else repr(text_value)
    assert (HIDDEN in text and text_value not in text) if is_secret(bad.loc) else shown in text


@pytest.mark.parametrize("bad", BAD, ids=str)
def test_a_bad_file_value_names_the_toml_key_and_the_file(bad: Bad, tmp_path: Path) -> None:
    f = tmp_path / "aenv.toml"
    f.write_text(_toml(bad.loc, bad.value))
    text = _error(f, env={})
    assert text.startswith(f"{toml_key(bad.loc)} in {f}: "), text
    assert bad.rule in text, text
    if is_secret(bad.loc):
        assert HIDDEN in text and str(bad.value) not in text
    else:
        assert repr(bad.value) in text, text


def test_a_value_of_the_wrong_type_from_the_env_is_one_line_too() -> None:
    rules = {int: "must be an integer", float: "must be a number", bool: "must be true or false"}
    checked = 0
    for loc, field in _fields():
        if loc in config.ENV_NAMES and field.annotation in rules:
            var = config.ENV_NAMES[loc]
            assert _error(env={var: "abc"}) == f"{var}: 'abc' {rules[field.annotation]}"
            checked += 1
    assert checked > 30  # AENV_PORT, AENV_MAX_SANDBOXES, AENV_BUILD_BASE, ...


def test_secrets_are_never_shown(tmp_path: Path) -> None:
    secrets = {loc for loc, _ in _fields() if is_secret(loc)}
    assert {("api_key",), ("cluster", "token")} <= secrets
    assert not is_secret(("secrets_key_file",)) and not is_secret(("tls_key_file",))
    for loc in secrets:
        f = tmp_path / "s.toml"
        listed = "list" in str(dict(_fields())[loc].annotation)  # accept_tokens
        bad = [["s3cr3t-marker"]] if listed else ["s3cr3t-marker"]  # not strings: refused
        f.write_text(_toml(loc, bad))
        text = _error(f, env={})
        assert "s3cr3t-marker" not in text, text
        if not listed:
            assert text == f"{toml_key(loc)} in {f}: {HIDDEN} must be a string"


def test_a_constrained_secret_and_a_validator_echoing_it_show_no_value() -> None:
    class Model(BaseModel):
        api_key: str = Field("k-x", pattern=r"^k-")
        token: str = ""

        @field_validator("token")
        @classmethod
        def _check(cls, v: str) -> str:
            if v:
                raise ValueError(f"token {v} is revoked")
            return v

    data = {"api_key": "hunter2", "token": "tok-hunter3"}
    try:
        Model.model_validate(data)
    except ValueError as e:
        errors = e.errors()  # type: ignore[attr-defined]
    sources = {("api_key",): "AENV_API_KEY", ("token",): "AENV_CLUSTER_TOKEN"}
    text = str(Explainer(data, sources, {}, None).explain(errors))
    assert text == (f"AENV_API_KEY: {HIDDEN} must match ^k-; "
                    f"AENV_CLUSTER_TOKEN: {HIDDEN}: token {HIDDEN} is revoked")  # fmt: skip


def test_credentials_in_a_url_are_not_shown() -> None:
    text = _error(env={"AENV_STORE_URL": "http://user:pw@minio:9000/b"})
    assert text.startswith("AENV_STORE_URL: 'http://(hidden)@minio:9000/b' must match ")
    assert "pw" not in text


def test_several_bad_values_are_one_line_joined_by_semicolons() -> None:
    text = _error(env={"AENV_INSTANCE": "toolongname1", "AENV_CLUSTER_LEASE_TTL_S": "1"})
    assert text.split("; ") == [
        "AENV_INSTANCE: 'toolongname1' must match ^[a-z][a-z0-9]{0,7}$",
        "AENV_CLUSTER_LEASE_TTL_S: '1' must be at least 2"]  # fmt: skip


def test_settings_that_go_together_name_both(tmp_path: Path) -> None:
    assert _error(env={"AENV_TLS_CERT_FILE": "/c.pem"}) == \
        "AENV_TLS_CERT_FILE ('/c.pem') and AENV_TLS_KEY_FILE (not set): must be set together"
    f = tmp_path / "t.toml"
    f.write_text('tls_key_file = "/k.pem"\n')
    assert _error(f, env={}) == \
        f"AENV_TLS_CERT_FILE (not set) and tls_key_file in {f} ('/k.pem'): must be set together"


def test_settings_of_a_section_that_go_together_name_both_and_hide_secrets() -> None:
    assert _error(env={"AENV_ETCD_PASSWORD": "hunter2"}) == (
        "AENV_ETCD_USER (not set) and AENV_ETCD_PASSWORD ((value hidden)): must be set "
        "together")
    assert _error(env={"AENV_ETCD_CERT_FILE": "/c.pem"}) == \
        "AENV_ETCD_CERT_FILE ('/c.pem') and AENV_ETCD_KEY_FILE (not set): must be set together"


def test_flags_are_named_as_flags() -> None:
    assert _error(env={}, port="x") == "--port: 'x' must be an integer"


def test_a_file_that_does_not_parse_or_is_missing_or_misshapen(tmp_path: Path) -> None:
    f = tmp_path / "bad.toml"
    f.write_text("instance = = 1\n")
    assert _error(f, env={}).startswith(f"{f}: not a valid TOML file: ")
    f.write_bytes(b'instance = "\xff"\n')
    assert _error(f, env={}).startswith(f"{f}: not a valid TOML file: ")
    missing = tmp_path / "none.toml"
    assert _error(env={"AENV_CONFIG": str(missing)}) == \
        f"AENV_CONFIG: cannot read {missing}: No such file or directory"
    assert _error(missing, env={}).startswith("--config: cannot read ")
    f.write_text("cluster = 5\n")
    assert _error(f, env={}) == f"cluster in {f}: 5 must be a table"
    f.write_text("default_shape = 5\n")
    assert _error(f, env={}) == f"default_shape in {f}: 5 must be a table"


def test_an_env_var_wins_and_is_named_over_the_file(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('instance = "fine"\n[cluster]\nprefix = "/ok/"\n')
    assert _error(f, env={"AENV_CLUSTER_PREFIX": "nope"}) == \
        "AENV_CLUSTER_PREFIX: 'nope' must match ^/.*/$"


# --- the commands ---------------------------------------------------------------------------

def _aenv(args: list[str], env: dict[str, str], home: Path) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("aenv")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "aenv.cli.main"]
    empty = home / "empty.toml"  # not the host's /etc/aenv/config.toml
    empty.touch()
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
            "AENV_CLI_CONFIG": str(home / "cli.json"), "AENV_CONFIG": str(empty)}
    return subprocess.run(cmd + args, env={**base, **env}, capture_output=True, text=True,
                          timeout=60)  # fmt: skip


def _one_line(r: subprocess.CompletedProcess[str], starts: str, *hidden: str) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(starts), r.stderr
    assert not any(n in r.stderr for n in NOISE), r.stderr
    for secret in hidden:
        assert secret not in r.stderr + r.stdout
    return lines[0]


@pytest.mark.parametrize("command", ["server", "gateway"])
def test_the_node_and_the_gateway_refuse_a_bad_setting_in_one_line(
    command: str, tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    env = {"AENV_DATA_DIR": str(data), "AENV_RUNTIME": "fake", "AENV_INSTANCE": "toolongname1",
           "AENV_API_KEY": "key-s3cr3t", "AENV_CLUSTER_TOKEN": "tok-s3cr3t"}
    line = _one_line(_aenv([command], env, tmp_path), "aenv: AENV_INSTANCE", "s3cr3t")
    assert line == "aenv: AENV_INSTANCE: 'toolongname1' must match ^[a-z][a-z0-9]{0,7}$"
    assert list(data.iterdir()) == []  # nothing started

    f = tmp_path / "aenv.toml"
    f.write_text('[cluster]\ntoken = ["tok-s3cr3t"]\n')
    # the file's token is the one refused (an env var would win over it)
    env = {k: v for k, v in env.items() if k != "AENV_CLUSTER_TOKEN"} | {
        "AENV_INSTANCE": "ok", "AENV_CONFIG": str(f)}
    r = _aenv([command], env, tmp_path)
    assert _one_line(r, "aenv: cluster.token", "s3cr3t") == \
        f"aenv: cluster.token in {f}: {HIDDEN} must be a string"
    f.write_text("[cluster\n")
    _one_line(_aenv([command], env, tmp_path), f"aenv: {f}: not a valid TOML file")
    r = _aenv([command], {**env, "AENV_CONFIG": str(tmp_path / "empty.toml"),
                          "AENV_PORT": "abc"}, tmp_path)  # fmt: skip
    assert _one_line(r, "aenv: AENV_PORT") == "aenv: AENV_PORT: 'abc' must be an integer"
    assert list(data.iterdir()) == []


def test_the_cli_refuses_a_bad_url_or_key_in_one_line(tmp_path: Path) -> None:
    r = _aenv(["ls"], {"E2B_API_URL": "ftp://node:8000", "E2B_API_KEY": "k"}, tmp_path)
    assert _one_line(r, "aenv: E2B_API_URL") == \
        "aenv: E2B_API_URL: 'ftp://node:8000' must be an http(s) URL (http[s]://host[:port])"
    r = _aenv(["ls"], {"AENV_URL": "http://u:pw-s3cr3t@exa mple"}, tmp_path)
    _one_line(r, "aenv: AENV_URL: 'http://(hidden)@exa mple' must be", "s3cr3t")
    r = _aenv(["ls"], {"E2B_API_URL": "http://127.0.0.1:9", "E2B_API_KEY": "s3cr3t é"},
              tmp_path)  # fmt: skip
    assert _one_line(r, "aenv: E2B_API_KEY", "s3cr3t") == \
        f"aenv: E2B_API_KEY: {HIDDEN} must be printable ASCII with no space at either end"
    r = _aenv(["ls"], {"E2B_API_URL": "http://127.0.0.1:9", "AENV_API_KEY": "s3cr3t\n"},
              tmp_path)  # fmt: skip
    _one_line(r, f"aenv: AENV_API_KEY: {HIDDEN} must be", "s3cr3t")
    (tmp_path / "cli.json").write_text('{"url": "gopher://x", "api_key": "k"}')
    r = _aenv(["ls"], {}, tmp_path)
    assert _one_line(r, "aenv: url in") == \
        f"aenv: url in {tmp_path / 'cli.json'}: 'gopher://x' must be an http(s) URL " \
        f"(http[s]://host[:port])"  # fmt: skip
