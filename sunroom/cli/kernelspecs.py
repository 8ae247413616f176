"""``sunroom kernelspecs``: the installed Jupyter kernels that ``--backend jupyter`` can run.

One line per kernelspec (name, language, whether host functions work in it, display name),
or with ``--json`` one JSON array of objects with those and the kernel's ``argv`` and
``resource_dir``. Host functions, inputs and ``submit`` work only in IPython kernels
(language ``python``); other kernels run code alone (docs/jupyter.md).
"""

from __future__ import annotations

import json

import typer

from sunroom.cli.support import JsonOption, fail
from sunroom.errors import UsageError
from sunroom.sandbox.backends.jupyter.specs import KernelSpecInfo, kernelspecs

__all__ = ["kernelspecs_command", "spec_json"]


def spec_json(spec: KernelSpecInfo) -> dict[str, object]:
    """*spec* as the JSON object ``sunroom kernelspecs --json`` prints."""
    return {
        "name": spec.name,
        "language": spec.language,
        "display_name": spec.display_name,
        "host_functions": spec.python,
        "argv": list(spec.argv),
        "resource_dir": spec.resource_dir,
    }


def kernelspecs_command(as_json: JsonOption = False) -> None:
    """List the installed Jupyter kernelspecs (for --backend jupyter --kernel-name NAME)."""
    try:
        specs = kernelspecs()
    except UsageError as exc:
        raise fail(str(exc)) from None
    if as_json:
        typer.echo(json.dumps([spec_json(s) for s in specs]))
        return
    if not specs:
        typer.echo("no Jupyter kernelspecs are installed (pip install ipykernel adds python3)")
        return
    rows = [("NAME", "LANGUAGE", "HOST FUNCTIONS", "DISPLAY NAME")]
    rows += [(s.name, s.language, "yes" if s.python else "no", s.display_name) for s in specs]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        typer.echo("  ".join([*cells, row[3]]))
