"""The ``sunroom`` command.

``sunroom exec [--backend NAME] [--timeout S] [--json] PATH|-`` runs a file (or stdin) in a
fresh kernel and prints its output, or the whole result as JSON. Exit status: 0 ok, 1 the code
raised, 124 timeout, 125 the kernel died, 2 usage or setup error (message on stderr).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from sunroom.errors import SunroomError
from sunroom.sandbox.backends import DEFAULT_BACKEND, NAMES
from sunroom.sandbox.limits import Limits
from sunroom.sandbox.sync import Kernel

EXIT_CODES = {"ok": 0, "error": 1, "timeout": 124, "died": 125}

app = typer.Typer(
    name="sunroom",
    help="A fast, typed, isolated runtime for agents that act by writing Python.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def _root() -> None:
    """A fast, typed, isolated runtime for agents that act by writing Python."""


@app.command("exec")
def exec_(
    path: Annotated[str, typer.Argument(help="A Python file to run, or - for stdin.")],
    backend: Annotated[
        str, typer.Option(help=f"Kernel backend: {', '.join(NAMES)}.")
    ] = DEFAULT_BACKEND,
    timeout: Annotated[float, typer.Option(help="Seconds the code may run.")] = 30.0,
    memory_mb: Annotated[int, typer.Option(help="Memory limit in MB.")] = 2048,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Run a file in a fresh kernel and print its output."""
    try:
        code = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as exc:
        typer.echo(f"sunroom: cannot read {path}: {exc.strerror}", err=True)
        raise typer.Exit(2) from None
    try:
        with Kernel(backend=backend, limits=Limits(timeout_s=timeout, memory_mb=memory_mb)) as k:
            result = k.execute(code)
    except SunroomError as exc:
        typer.echo(f"sunroom: {exc}", err=True)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps(result.to_dict()))
    else:
        sys.stdout.write(result.stdout)
        sys.stderr.write(result.stderr)
        if result.value is not None:
            sys.stdout.write(result.value + "\n")
        if result.error is not None:
            err = result.error
            text = err.traceback or f"{err.type}: {err.message}"
            sys.stderr.write(text if text.endswith("\n") else text + "\n")
    raise typer.Exit(EXIT_CODES[result.status])


def main() -> None:
    """Entry point of the ``sunroom`` console script."""
    app()


if __name__ == "__main__":
    main()
