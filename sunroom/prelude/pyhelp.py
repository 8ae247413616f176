"""``help()`` inside the kernel.

Kernels run with ``python -S`` (no ``site``), which is where the interactive ``help`` builtin
comes from; this module installs a plain-text one, so ``help(github.search_issues)`` prints the
signature and the full docstring. :mod:`pydoc` is imported at the first call, not at start.
Standard library only.
"""

from __future__ import annotations

import builtins


def help(obj: object = None) -> None:  # noqa: A001 - it is the builtin
    """Print the documentation of *obj* (a function, module, class or value) as plain text."""
    import pydoc

    if obj is None:
        print("Call help(obj) with a function, module or class to read its documentation.")
        return
    plain = pydoc.plaintext  # type: ignore[attr-defined]
    print(pydoc.render_doc(obj, title="Help on %s:", renderer=plain))


def install() -> None:
    """Make :func:`help` a builtin, unless one exists already."""
    if not hasattr(builtins, "help"):
        builtins.help = help  # type: ignore[assignment]
