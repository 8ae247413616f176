"""``sunroom build-helpers``: compile the kernels' watcher and launcher on this host.

The wheel carries both (``sunroom-watch``, ``sunroom-launch``); an install without a C compiler
(an sdist) has neither, and its kernels then watch in Python and start through ``setpriv``
(:mod:`sunroom.sandbox.watcher`). Once a compiler is there, this builds them into the installed
package; building again is a no-op while each was built from its source as it is.
"""

from __future__ import annotations

from typing import Annotated

import typer

from sunroom.sandbox.watcher import build_all

__all__ = ["build_helpers_command"]


def build_helpers_command(
    force: Annotated[
        bool, typer.Option("--force", help="Rebuild both even where they are up to date.")
    ] = False,
) -> None:
    """Compile the kernels' watcher and launcher from their C sources (needs a C compiler)."""
    code = build_all(force=force)
    if code:
        raise typer.Exit(code)
