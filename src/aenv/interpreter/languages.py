"""Language names as the SDKs send them, the kernel spec each runs on, and the code that sets
and restores environment variables in each (values quoted for the language, never pasted)."""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping

ALIASES = {"js": "javascript", "ts": "typescript"}
KERNEL_OF = {"python": "python3"}  # the others' specs are named as their languages
DEFAULT_CWD = "/home/user"


def normalize(language: str | None) -> str:
    """The SDKs' language name: empty is python; `js` and `ts` are aliases."""
    name = (language or "").strip().lower() or "python"
    return ALIASES.get(name, name)


def kernel_spec(language: str) -> str:
    return KERNEL_OF.get(language, language)


def _py(s: str) -> str:
    return repr(s)


def _js(s: str) -> str:
    return json.dumps(s)


def _r(s: str) -> str:
    return json.dumps(s)  # R reads a double-quoted string with JSON's escapes


def set_envs(language: str, envs: Mapping[str, str]) -> str | None:
    """Code that sets `envs` in a kernel of `language`; None if it has no way to."""
    if not envs:
        return None
    items = sorted(envs.items())
    if language == "python":
        return "import os as _aenv_os\n" + "".join(
            f"_aenv_os.environ[{_py(k)}] = {_py(v)}\n" for k, v in items) + "del _aenv_os\n"
    if language in ("javascript", "typescript"):
        return "".join(f"process.env[{_js(k)}] = {_js(v)};\n" for k, v in items)
    if language == "bash":
        return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in items if k.isidentifier())
    if language == "r":
        return "".join(f"Sys.setenv({_r(k)} = {_r(v)})\n" for k, v in items)
    if language == "java":  # system properties: the JVM's environment cannot change
        return "".join(f"System.setProperty({_js(k)}, {_js(v)});\n" for k, v in items)
    return None


def restore_envs(language: str, names: list[str], globals_: Mapping[str, str]) -> str | None:
    """Code that undoes a run's `names`: back to the sandbox's value, or unset."""
    back = {k: globals_[k] for k in names if k in globals_}
    gone = sorted(k for k in names if k not in globals_)
    code = set_envs(language, back) or ""
    if language == "python" and gone:
        code += "import os as _aenv_os\n" + "".join(
            f"_aenv_os.environ.pop({_py(k)}, None)\n" for k in gone) + "del _aenv_os\n"
    elif language in ("javascript", "typescript"):
        code += "".join(f"delete process.env[{_js(k)}];\n" for k in gone)
    elif language == "bash":
        code += "".join(f"unset {k}\n" for k in gone if k.isidentifier())
    elif language == "r":
        code += "".join(f"Sys.unsetenv({_r(k)})\n" for k in gone)
    elif language == "java":
        code += "".join(f"System.clearProperty({_js(k)});\n" for k in gone)
    return code or None
