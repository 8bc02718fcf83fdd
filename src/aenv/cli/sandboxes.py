"""Sandbox commands: start, ls, exec, cn, pause, resume, rm, timeout, fork.

Every ID argument may be any unique prefix of a sandbox id (like docker).
"""

from __future__ import annotations

import contextlib
import re
import shlex
import sys
import threading
from typing import Annotated, Any

import typer

from aenv.cli import completion, output
from aenv.cli.client import ApiError, Node
from aenv.cli.envd import Envd, EnvdError, SandboxGone, unb64
from aenv.cli.errors import EXIT_ERROR, EXIT_INTERRUPTED, CliError
from aenv.cli.terminal import exit_status, shell

DEFAULT_TIMEOUT_S = 300

SandboxId = Annotated[
    str, typer.Argument(help="Sandbox id or a unique prefix of one.", metavar="ID",
                        autocompletion=completion.sandbox_ids, show_default=False),
]  # fmt: skip
SandboxIds = Annotated[
    list[str], typer.Argument(help="Sandbox ids or unique prefixes.", metavar="ID...",
                              autocompletion=completion.sandbox_ids, show_default=False),
]  # fmt: skip
JsonOpt = Annotated[
    bool | None,
    typer.Option("--json/--table", help="JSON or a table [default: table on a terminal, "
                 "JSON when piped]", show_default=False),
]  # fmt: skip


# --- argument parsing -------------------------------------------------------------------------

_UNITS_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
_UNITS_MIB = {"": 1, "m": 1, "mb": 1, "mib": 1, "g": 1024, "gb": 1024, "gib": 1024}


def parse_seconds(text: str) -> int:
    """`90`, `90s`, `5m`, `2h`, `1d` → seconds."""
    m = re.fullmatch(r"\s*(\d+)\s*([smhd]?)\s*", text.lower())
    if not m:
        raise typer.BadParameter(f"{text!r} is not a duration like 300, 90s, 5m or 2h")
    return int(m[1]) * _UNITS_S[m[2]]


def parse_mib(text: str) -> int:
    """`512`, `512M`, `2G` → MiB."""
    m = re.fullmatch(r"\s*(\d+)\s*([a-z]*)\s*", text.lower())
    if not m or m[2] not in _UNITS_MIB:
        raise typer.BadParameter(f"{text!r} is not a size like 512, 512M or 2G (MiB)")
    return int(m[1]) * _UNITS_MIB[m[2]]


def parse_pairs(items: list[str] | None, what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{what} {item!r} is not KEY=VALUE")
        out[key] = value
    return out


# --- helpers ----------------------------------------------------------------------------------


def open_envd(node: Node, sandbox: dict[str, Any]) -> Envd:
    return Envd(node.origin, sandbox["sandboxID"], sandbox.get("envdAccessToken"))


def running_sandbox(node: Node, prefix: str, action: str) -> dict[str, Any]:
    """The sandbox's details; a paused one is an error that says how to resume it."""
    sid = node.resolve(prefix)
    detail = node.sandbox(sid)
    if detail.get("state") == "paused":
        raise CliError(f"sandbox {sid} is paused: resume it first with `aenv resume {sid}` "
                       f"(or use `aenv cn {sid}`, which resumes it) before {action}")  # fmt: skip
    return detail


def _each(ids: list[str], act: Any) -> None:
    """Run `act(node, full_id)` for every id; report each failure, exit 1 if any failed."""
    from aenv.cli.errors import each

    with Node() as node:
        each(ids, lambda prefix: act(node, node.resolve(prefix)))


# --- start ------------------------------------------------------------------------------------


def start(
    template: Annotated[str, typer.Argument(
        help="Template name or id (or a snapshot id).", autocompletion=completion.template_names,
    )] = "base",
    timeout: Annotated[str, typer.Option(
        "--timeout", "-t", help="Seconds until the sandbox is removed (90, 5m, 2h). An attached "
        "shell keeps it alive.")] = str(DEFAULT_TIMEOUT_S),
    cpu: Annotated[int | None, typer.Option("--cpu", help="vCPUs [default: the template's]",
                                            min=1, max=64, show_default=False)] = None,
    memory: Annotated[str | None, typer.Option(
        "--memory", "-m", help="Guest RAM: 512, 512M, 2G [default: the template's]",
        show_default=False)] = None,
    detach: Annotated[bool, typer.Option(
        "--detach", "-d", help="Print the new sandbox's id and return; no shell.")] = False,
    keep: Annotated[bool, typer.Option(
        "--keep", help="Keep the sandbox when the shell exits (until its timeout).")] = False,
    env: Annotated[list[str] | None, typer.Option(
        "--env", "-e", help="KEY=VALUE in the environment of every process (repeatable).",
        show_default=False)] = None,
    metadata: Annotated[list[str] | None, typer.Option(
        "--metadata", help="KEY=VALUE metadata (repeatable).", show_default=False)] = None,
) -> None:
    """Start a sandbox and open a shell in it; the sandbox is removed when the shell exits.

    With -d, print its id instead and leave it running until its timeout. With --keep, the
    shell's sandbox outlives the shell (reattach with `aenv cn ID`).
    """
    body: dict[str, Any] = {
        "templateID": template,
        "timeout": parse_seconds(timeout),
        "metadata": parse_pairs(metadata, "metadata"),
        "envVars": parse_pairs(env, "--env"),
    }
    if cpu is not None:
        body["cpuCount"] = cpu
    if memory is not None:
        body["memoryMB"] = parse_mib(memory)
    if not detach and not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise CliError("`aenv start` opens a shell and needs a terminal: "
                       "use `aenv start -d` to start one in the background")  # fmt: skip
    with Node() as node:
        try:
            with output.status(f"Starting a sandbox from {template}..."):
                sbx = node.create(body)
        except KeyboardInterrupt:
            raise CliError("interrupted: a sandbox being created may still appear and will be "
                           f"removed after its timeout ({body['timeout']} s)",
                           EXIT_INTERRUPTED) from None  # fmt: skip
        sid = sbx["sandboxID"]
        if detach:
            output.print_lines([sid])
            return
        code = EXIT_ERROR
        try:
            with open_envd(node, sbx) as envd:
                code = shell(envd, keepalive=lambda: node.refresh(sid, 60))
        finally:
            if keep:
                output.info(f"sandbox {sid} kept: `aenv cn {sid}` attaches again")
            else:
                with contextlib.suppress(CliError):
                    node.kill(sid)
    raise typer.Exit(code)


# --- ls ---------------------------------------------------------------------------------------


def ls(
    state: Annotated[str | None, typer.Option(
        "--state", "-s", help="running, paused or running,paused [default: both]",
        show_default=False)] = None,
    as_json: JsonOpt = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only ids.")] = False,
    wide: Annotated[bool, typer.Option(
        "--wide", "-w", help="Also the host memory each running sandbox holds, measured.")
    ] = False,
) -> None:
    """List sandboxes, newest first."""
    if state is not None:
        parts = [p.strip() for p in state.split(",") if p.strip()]
        bad = [p for p in parts if p not in ("running", "paused")]
        if bad or not parts:
            raise typer.BadParameter("must be running, paused or running,paused",
                                     param_hint="'--state'")  # fmt: skip
        state = ",".join(parts)
    with Node() as node:
        items = node.sandboxes(state)
        if wide:
            for s in items:
                if s.get("state") == "running":
                    with contextlib.suppress(CliError):  # gone meanwhile
                        s["hostMemory"] = node.sandbox(s["sandboxID"]).get("hostMemory")
    if quiet:
        output.print_lines([s["sandboxID"] for s in items])
    elif output.want_json(as_json):
        output.print_json(items)
    else:
        rows = [
            [
                s["sandboxID"],
                s.get("alias") or s.get("templateID", ""),
                s.get("state", "") + (f" ({s['pauseTier']})" if s.get("pauseTier") else ""),
                output.ago(s.get("startedAt")),
                output.until(s.get("endAt")),
                str(s.get("cpuCount", "")),
                f"{s.get('memoryMB', '')} MiB",
                *(_held(s.get("hostMemory")) if wide else []),
                ",".join(f"{k}={v}" for k, v in (s.get("metadata") or {}).items()),
            ]
            for s in items
        ]
        held = ["HELD", "OWN", "SHARED"] if wide else []
        output.print_table(
            ["ID", "TEMPLATE", "STATE", "STARTED", "EXPIRES", "CPU", "MEMORY", *held,
             "METADATA"], rows)  # fmt: skip


def _held(m: dict[str, float] | None) -> list[str]:
    """PSS, own and shared guest RAM (GET /sandboxes/{id} `hostMemory`), or blanks."""
    if not m:
        return ["-", "-", "-"]
    return [f"{m['pssMiB']:.0f} MiB", f"{m['ownMiB']:.0f} MiB", f"{m['sharedMiB']:.0f} MiB"]


# --- exec -------------------------------------------------------------------------------------


def _pump_stdin(envd: Envd, pid: int) -> None:
    try:
        while True:
            chunk = sys.stdin.buffer.read1(65536)
            if not chunk:
                break
            envd.send_input(pid, chunk)
        envd.close_stdin(pid)
    except (CliError, OSError, ValueError):
        pass


def exec_(
    sandbox: SandboxId,
    command: Annotated[list[str], typer.Argument(
        help="The command. One argument is a shell command line (`'echo $HOME | wc -c'`); "
        "several are run as they are, quoted.", show_default=False, metavar="-- CMD...")],
    interactive: Annotated[bool, typer.Option(
        "--interactive", "-i", help="Send this program's stdin to the command.")] = False,
    cwd: Annotated[str | None, typer.Option("--cwd", "-w", help="Working directory.",
                                            show_default=False)] = None,
    env: Annotated[list[str] | None, typer.Option(
        "--env", "-e", help="KEY=VALUE for this command (repeatable).",
        show_default=False)] = None,
) -> None:
    """Run a command in a sandbox; its stdout and stderr stream here, and its exit code is
    aenv's. Ctrl-C stops the command."""
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise typer.BadParameter("no command given", param_hint="CMD")
    line = command[0] if len(command) == 1 else shlex.join(command)
    envs = parse_pairs(env, "--env")
    with Node() as node:
        detail = running_sandbox(node, sandbox, "running commands in it")
        with open_envd(node, detail) as envd:
            code = _run(envd, line, envs, cwd, interactive)
    raise typer.Exit(code)


def _run(envd: Envd, line: str, envs: dict[str, str], cwd: str | None, interactive: bool) -> int:
    out, err = sys.stdout.buffer, sys.stderr.buffer
    pid: int | None = None
    try:
        with envd.start("/bin/bash", ["-l", "-c", line], envs=envs, cwd=cwd,
                        stdin=interactive) as events:  # fmt: skip
            for msg in events:
                event = msg.get("event") or {}
                if "start" in event:
                    pid = int(event["start"].get("pid", 0))
                    if interactive:
                        threading.Thread(target=_pump_stdin, args=(envd, pid),
                                         daemon=True).start()  # fmt: skip
                elif "data" in event:
                    data = event["data"]
                    if "stdout" in data:
                        out.write(unb64(data["stdout"]))
                        out.flush()
                    elif "stderr" in data:
                        err.write(unb64(data["stderr"]))
                        err.flush()
                elif "end" in event:
                    return exit_status(event["end"])
    except KeyboardInterrupt:
        if pid is not None:
            with contextlib.suppress(CliError):
                envd.signal(pid, "SIGKILL")
        raise CliError("interrupted: the command was stopped", EXIT_INTERRUPTED) from None
    except SandboxGone as e:
        raise CliError(e.message) from None
    except EnvdError as e:
        raise CliError(f"running the command failed: {e.message}") from None
    raise CliError(f"the command's output ended without an exit status (sandbox "
                   f"{envd.sandbox_id})")  # fmt: skip


# --- cn ---------------------------------------------------------------------------------------


def cn(sandbox: SandboxId) -> None:
    """Open a shell in a sandbox (resuming it first if it is paused). Exiting the shell leaves
    the sandbox running."""
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise CliError("`aenv cn` opens a shell and needs a terminal: "
                       "use `aenv exec ID -- CMD` to run a command")  # fmt: skip
    with Node() as node:
        sid = node.resolve(sandbox)
        detail = node.sandbox(sid)
        if detail.get("state") == "paused":
            with output.status(f"Resuming {sid}..."):
                detail, _ = node.connect(sid)
        with open_envd(node, detail) as envd:
            code = shell(envd, keepalive=lambda: node.refresh(sid, 60))
    raise typer.Exit(code)


# --- pause, resume, rm, timeout ---------------------------------------------------------------


def pause(sandboxes: SandboxIds) -> None:
    """Pause sandboxes: their memory and disk are saved and the VM stops."""

    def act(node: Node, sid: str) -> None:
        try:
            node.sandbox_call("POST", sid, "/pause", (204,), "pause", json={})
        except ApiError as e:
            if e.status != 409 or node.sandbox(sid).get("state") != "paused":
                raise
            output.info(f"{sid} was already paused")
        output.print_lines([sid])

    _each(sandboxes, act)


def resume(
    sandboxes: SandboxIds,
    timeout: Annotated[str | None, typer.Option(
        "--timeout", "-t", help="Seconds the resumed sandbox lives [default: 300]",
        show_default=False)] = None,
) -> None:
    """Resume paused sandboxes (same id, processes and files)."""
    secs = parse_seconds(timeout) if timeout is not None else None

    def act(node: Node, sid: str) -> None:
        if node.sandbox(sid).get("state") == "running":
            output.info(f"{sid} is already running")
        else:
            with output.status(f"Resuming {sid}..."):
                node.connect(sid, secs)
        output.print_lines([sid])

    _each(sandboxes, act)


def rm(sandboxes: SandboxIds) -> None:
    """Remove sandboxes (running or paused)."""

    def act(node: Node, sid: str) -> None:
        node.kill(sid)
        output.print_lines([sid])

    _each(sandboxes, act)


def timeout(
    sandbox: SandboxId,
    seconds: Annotated[str, typer.Argument(
        help="Seconds from now until the sandbox is removed (90, 5m, 2h).", metavar="SECS")],
) -> None:
    """Set a sandbox to be removed SECS from now (shorter or longer than before)."""
    secs = parse_seconds(seconds)
    with Node() as node:
        sid = node.resolve(sandbox)
        node.sandbox_call("POST", sid, "/timeout", (204,), "timeout", json={"timeout": secs})


# --- fork -------------------------------------------------------------------------------------


def fork(
    sandbox: SandboxId,
    count: Annotated[int, typer.Option("--count", "-n", min=1, max=20,
                                       help="How many children.")] = 1,
    timeout: Annotated[str | None, typer.Option(
        "--timeout", "-t", help="Seconds the children live [default: the node's]",
        show_default=False)] = None,
) -> None:
    """Fork a running sandbox into COUNT children (memory, processes and files copied);
    prints the children's ids."""
    body: dict[str, Any] = {"count": count}
    if timeout is not None:
        body["timeout"] = parse_seconds(timeout)
    with Node() as node:
        sid = running_sandbox(node, sandbox, "forking it")["sandboxID"]
        with output.status(f"Forking {sid}..."):
            r = node.sandbox_call("POST", sid, "/fork", (200, 201), "fork", json=body)
    results = r.json()
    ids, errors = [], []
    for item in results if isinstance(results, list) else []:
        if isinstance(item, dict) and isinstance(item.get("sandbox"), dict):
            ids.append(item["sandbox"]["sandboxID"])
        elif isinstance(item, dict) and isinstance(item.get("error"), dict):
            errors.append(str(item["error"].get("message") or item["error"]))
    output.print_lines(ids)
    if errors or not ids:
        from aenv.cli.errors import say_error

        for msg in errors or ["the node returned no children"]:
            say_error(f"fork of {sid}: {msg}")
        raise typer.Exit(EXIT_ERROR)
