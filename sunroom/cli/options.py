"""What several ``sunroom`` commands' options share, turned into what the commands take.

The backend that ``--backend``/``--kernel-name``/``--sandbox`` choose (``exec``, ``run``,
``mcp``), a ``scripted:`` model spec made absolute (``serve``, ``run``, ``mcp``), the
``--input NAME=FILE`` pairs (``exec``, ``run``), the servers of an ``--mcp`` JSON file
(``exec``, ``serve``) and the terminal graphics protocol of ``--inline-images`` (``run``,
``sessions show``, ``sessions resume``). A bad value exits 2 with one line on stderr.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from sunroom.cli.support import fail, read_json
from sunroom.errors import SunroomError
from sunroom.sandbox.backend import Backend
from sunroom.sandbox.backends.choice import OPTION_NAMES, choose_backend
from sunroom.sandbox.inputs import File

if TYPE_CHECKING:
    from rich.console import Console

    from sunroom.cli.terminal_images import Protocol

__all__ = ["chosen_backend", "file_inputs", "inline_protocol", "mcp_servers", "model_spec"]


def chosen_backend(backend: str, kernel_name: str | None, sandbox: str | None) -> str | Backend:
    """The backend that ``--backend``, ``--kernel-name``, ``--sandbox`` name; exit 2 if none."""
    try:
        return choose_backend(backend, kernel_name=kernel_name, sandbox=sandbox, names=OPTION_NAMES)
    except SunroomError as exc:
        raise fail(str(exc)) from None


def mcp_servers(path: Path | None) -> dict[str, object] | None:
    """The ``mcpServers`` entries of the JSON file *path* (None: no file)."""
    if path is None:
        return None
    data = read_json(path, what="the MCP config")
    servers = data.get("mcpServers") if isinstance(data, dict) else None
    if not isinstance(servers, dict):
        raise fail(f'the MCP config {path} needs an object under "mcpServers"')
    return servers


def model_spec(spec: str | None) -> str | None:
    """*spec*, with the file of a ``scripted:`` model made absolute (a resume may run elsewhere)."""
    if spec and spec.startswith("scripted:"):
        return f"scripted:{Path(spec.removeprefix('scripted:')).resolve()}"
    return spec


def file_inputs(pairs: list[str]) -> dict[str, File]:
    """``--input NAME=FILE`` pairs as File inputs; exits 2 on a bad pair, a NAME twice, no file."""
    out: dict[str, File] = {}
    for pair in pairs:
        name, sep, file = pair.partition("=")
        if not sep or not name.isidentifier() or not file:
            raise fail(f"--input takes NAME=FILE, got {pair!r}")
        if name in out:
            raise fail(f"--input {name} is given twice; each NAME binds one file")
        if not os.path.isfile(file):
            raise fail(f"--input {name}: {file} is not a readable file")
        out[name] = File(file)
    return out


def inline_protocol(mode: str, console: Console) -> Protocol | None:
    """The graphics protocol ``--inline-images`` *mode* gives on *console* (None: no images)."""
    from sunroom.cli.terminal_images import detect  # sunroom.service is heavy to import

    try:
        return detect(mode, os.environ, is_terminal=console.is_terminal)
    except SunroomError as exc:
        raise fail(str(exc)) from None
