"""`aenv template build NAME -f Dockerfile [CONTEXT]`: a build through the node's E2B build
API, as any E2B client does it. The E2B SDK itself parses the Dockerfile
(`Template.from_dockerfile`: FROM, RUN, COPY/ADD, ENV/ARG, WORKDIR, USER; CMD/ENTRYPOINT
become the start command) and uploads the COPY sources, so the CLI builds exactly what the
SDK would. Needs no root; the log streams as the build runs; Ctrl-C cancels the build."""

from __future__ import annotations

import re
from pathlib import Path

from aenv.cli import output
from aenv.cli.client import Node
from aenv.cli.errors import EXIT_INTERRUPTED, CliError

_CREATED = re.compile(r"Template created with ID: (\S+), Build ID: (\S+)")


def build_dockerfile(name: str, dockerfile: Path, context: Path | None, cpu: int | None,
                     memory_mib: int | None, force: bool) -> None:
    from e2b import Template
    from e2b.exceptions import BuildException, FileUploadException, TemplateException

    if not dockerfile.is_file():
        raise CliError(f"no such Dockerfile: {dockerfile}")
    ctx = (context or dockerfile.parent).expanduser().resolve()
    if not ctx.is_dir():
        raise CliError(f"the build context {ctx} is not a directory")
    try:
        template = Template(file_context_path=str(ctx)).from_dockerfile(str(dockerfile))
    except (ValueError, OSError) as e:
        raise CliError(f"{dockerfile}: {e}") from None
    started: list[tuple[str, str]] = []
    say, stop = output.build_progress()

    def on_log(entry: object) -> None:
        msg = str(getattr(entry, "message", entry))
        m = _CREATED.search(msg)
        if m:
            started.append((m.group(1), m.group(2)))
        say(msg)

    with Node() as node:
        try:
            Template.build(template, name, cpu_count=cpu, memory_mb=memory_mib,
                           skip_cache=force, on_build_logs=on_log, api_url=node.origin,
                           api_key=node.settings.api_key or "aenv")  # fmt: skip
        except KeyboardInterrupt:
            if started:
                tid, bid = started[-1]
                node.http.delete(f"/templates/{tid}/builds/{bid}")
            raise CliError(f"interrupted: the build of {name} was cancelled",
                           EXIT_INTERRUPTED) from None
        except (BuildException, FileUploadException, TemplateException) as e:
            raise CliError(f"building {name} failed: {e}") from None
        finally:
            stop()
    output.print_lines([name])
